"""Experiments as MLflow runs: ``orch experiments export --mlflow`` and the ``[mlflow] mirror``.

The only module that imports mlflow, an optional extra (``mlflow``, docs/install.md), and only inside
functions. Each experiment is one MLflow run, found again by its tags ``orch.registry`` and
``orch.experiment`` and updated in place: parameters are logged once, metric points only at steps the run
does not have yet, tags and status set to what the record says now. Exporting again duplicates nothing.

    params    the recorded settings flattened (``run.stop_timeout``), the batching section as ``batching.*``
    tags      ``orch.*`` (revision, git commit and dirty flag, target, CT, node, checkpoints, status, …),
              ``mlflow.runName``, ``mlflow.parentRunId`` (the parent experiment's run), ``mlflow.note.content``
    metrics   the registry's series, every metric the log gave (loss, val_loss, lr, ppl, tok_s, ...) with their steps
    artifact  the run's log, ``train.log`` (node 0's for a job), read from its target when that answers
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..config import Settings
from ..errors import InputError, NotFoundError, OrchError, TargetError, extra_hint
from ..records.experiments import FINAL, Experiment, Registry, command_line
from ..reach.targets import Target

#: orch's status -> MLflow's (``lost``: its container restarted under it; it may still resume)
STATUS = {"launching": "SCHEDULED", "queued": "SCHEDULED", "running": "RUNNING", "finished": "FINISHED",
          "crashed": "FAILED", "failed": "FAILED", "stopped": "KILLED", "lost": "FAILED"}
INSTALL_HINT = extra_hint("mlflow")
LOG_NAME = "train.log"
CHUNK = 4 << 20  # bytes of log per agent call
# MLflow's limits (mlflow/utils/validation.py)
PARAM_LEN, TAG_LEN, KEY_LEN = 6000, 8000, 250
PER_BATCH = {"params": 100, "metrics": 1000}  # and 100 tags
# a command waits this long at most for an MLflow server that does not answer (MLflow's own variables win)
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}


def tracking_uri(settings: Settings, given: str | None = None) -> str:
    """Where runs go: ``given`` (``--mlflow URI``), else ``[mlflow] tracking_uri`` (a relative SQLite path in
    it is taken from the project folder), else ``MLFLOW_TRACKING_URI``, else a SQLite store beside the
    registry (MLflow 3 refuses a plain ``./mlruns`` folder unless ``MLFLOW_ALLOW_FILE_STORE`` is set)."""
    if given:
        return given
    configured = settings.mlflow.tracking_uri
    if configured:
        path = configured[len("sqlite:///"):] if configured.startswith("sqlite:///") else None
        if path and not path.startswith("/") and path != ":memory:":
            return "sqlite:///" + str(settings.project_dir / path)
        return configured
    return os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///" + str(settings.state_dir / "mlflow.db")


def shown(uri: str) -> str:
    """The URI as output names it: a password in it is never printed."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _library() -> Any:
    for name, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)
    try:
        import logging

        import mlflow  # noqa: F401
        from mlflow import MlflowClient
    except ImportError as exc:
        raise InputError(f"exporting to MLflow needs the mlflow library, which is not installed ({exc})",
                         hint=INSTALL_HINT) from exc
    for name in ("mlflow", "alembic"):  # its database set-up talks on stderr at INFO
        logging.getLogger(name).setLevel(logging.WARNING)
    return MlflowClient


@contextmanager
def _translated(uri: str) -> Iterator[None]:
    """MLflow's exceptions as orch's: a server that cannot be reached is a ``TargetError`` (exit 3)."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except MlflowException as exc:
        text = str(exc.message if hasattr(exc, "message") else exc)
        if "API request to" in text and ("Max retries exceeded" in text or "Connection" in text):
            raise TargetError(f"cannot reach the MLflow tracking server {shown(uri)}: {text.splitlines()[0]}",
                              hint="start it (mlflow server), or name another with --mlflow URI or "
                                   "[mlflow] tracking_uri") from None
        raise OrchError(f"MLflow ({shown(uri)}) refused: {text.splitlines()[0] if text else exc}",
                        hint="see MLflow's message; --mlflow URI or [mlflow] tracking_uri names the store") from None


@contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    """One export of this clone at a time: two commands mirroring at once never both create a run."""
    import fcntl

    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / "mlflow.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _ms(t: float | None) -> int | None:
    return None if t is None else int(t * 1000)


def _key(name: str) -> str:
    return re.sub(r"[^/\w.\- :]", "_", name)[:KEY_LEN]


def _text(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif prefix:
        out[_key(prefix)] = _text(value, PARAM_LEN)


def params(exp: Experiment) -> dict[str, str]:
    """The recorded settings as MLflow params: ``section.key`` (nested keys joined by dots), the batching
    section as ``batching.*``; values as orch.toml would write them (``true``, ``["train.py"]``)."""
    out: dict[str, str] = {}
    _flatten("", {k: v for k, v in (exp.config or {}).items() if k != "batching"}, out)
    _flatten("batching", exp.batching or (exp.config or {}).get("batching") or {}, out)
    return out


def run_name(exp: Experiment) -> str:
    return _text(f"exp {exp.id}" + (f": {exp.message}" if exp.message else ""), 250)


def tags(exp: Experiment, registry_id: str, parent_run: str | None) -> dict[str, str]:
    """What identifies the run and what the record says of it; empty values are left out."""
    info = exp.target_info or {}
    record = exp.model_dump()
    found: dict[str, Any] = {
        "orch.registry": registry_id, "orch.experiment": exp.id, "orch.project": exp.project,
        "orch.status": exp.status, "orch.exit_code": exp.exit_code, "orch.end_reason": exp.end_reason,
        "orch.error": exp.error, "orch.message": exp.message, "orch.command": command_line(exp.command),
        "orch.revision": exp.revision, "orch.git_commit": exp.git_commit,
        "orch.git_dirty": None if exp.git_dirty is None else str(exp.git_dirty).lower(),
        "orch.target": exp.target, "orch.ct": info.get("ct"), "orch.node": info.get("node"),
        "orch.address": info.get("address"), "orch.parent": exp.parent,
        "orch.checkpoints": exp.checkpoints, "orch.checkpoints_action": exp.checkpoints_action,
        "orch.checkpoints_entry": exp.checkpoints_entry,
        "orch.sweep": record.get("sweep"),  # a record that belongs to a sweep names it
        "orch.nodes": ", ".join(str(n.get("label")) for n in exp.nodes) if exp.nodes else None,
        "mlflow.runName": run_name(exp), "mlflow.note.content": exp.message,
        "mlflow.source.git.commit": exp.git_commit, "mlflow.parentRunId": parent_run,
    }
    return {k: _text(str(v), TAG_LEN) for k, v in found.items() if v not in (None, "")}


def metric_points(stored: dict | None) -> dict[str, list[tuple[int, float]]]:
    """The registry's metric series as (step, value) points, one per step (the last value a step had)."""
    from .metrics import Series

    out: dict[str, list[tuple[int, float]]] = {}
    for key, data in ((stored or {}).get("series") or {}).items():
        by_step: dict[int, float] = {}
        for x, y in Series.from_dict(data).points():
            by_step[int(round(x))] = y
        out[_key(key)] = sorted(by_step.items())
    return out


class Exporter:
    """One MLflow experiment (``[mlflow] experiment``, default the project's name) holding this registry's
    runs, and the runs already there, found by their tags."""

    def __init__(self, settings: Settings, registry: Registry, uri: str) -> None:
        client_class = _library()
        self.uri, self.registry = uri, registry
        self.series: dict[int, list] = {}  # the series runs' supervisors kept, where read (``series_read``)
        self.registry_id = registry.registry_id
        self.name = settings.mlflow.experiment or settings.project.name
        with _translated(uri):
            self.client = client_class(tracking_uri=uri)
            self.experiment_id = self._experiment(settings.project.name)
            self.runs = self._runs()

    def _experiment(self, project: str) -> str:
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(self.name)
        if found is None:
            try:
                return self.client.create_experiment(self.name, artifact_location=_artifacts(self.uri),
                                                     tags={"orch.project": project})
            except MlflowException:  # made by another process in the meantime
                found = self.client.get_experiment_by_name(self.name)
                if found is None:
                    raise
        if found.lifecycle_stage == "deleted":
            raise InputError(f"the MLflow experiment {self.name!r} in {shown(self.uri)} is deleted",
                             hint=f"restore it (`mlflow experiments restore --experiment-id {found.experiment_id}`) "
                                  "or name another with [mlflow] experiment")
        return found.experiment_id

    def _runs(self) -> dict[int, Any]:
        out: dict[int, Any] = {}
        token = None
        while True:
            page = self.client.search_runs([self.experiment_id], f"tags.`orch.registry` = '{self.registry_id}'",
                                           max_results=1000, order_by=["attributes.start_time ASC"],
                                           page_token=token)
            for run in page:
                key = run.data.tags.get("orch.experiment", "")
                if key.isdigit():
                    out.setdefault(int(key), run)
            token = page.token
            if not token:
                return out

    def export(self, exp: Experiment) -> dict:
        """Create or update ``exp``'s run; its parent's run, when there is one, must be exported first."""
        from mlflow.entities import Metric, Param, RunTag

        from .series_read import points_of as series_points

        with _translated(self.uri):
            parent = self.runs.get(exp.parent) if exp.parent else None
            wanted = tags(exp, self.registry_id, parent.info.run_id if parent else None)
            run = self.runs.get(exp.id)
            created = run is None
            if run is None:
                run = self.client.create_run(self.experiment_id, start_time=_ms(exp.started or exp.created),
                                             tags=wanted, run_name=wanted["mlflow.runName"])
            run_id = run.info.run_id
            have_params, have_tags = ({}, wanted) if created else (run.data.params, run.data.tags)
            recorded = params(exp)
            new_params = [Param(k, v) for k, v in recorded.items() if k not in have_params]
            kept = sorted(k for k, v in recorded.items() if k in have_params and have_params[k] != v)
            new_tags = [RunTag(k, v) for k, v in wanted.items() if have_tags.get(k) != v]
            stamp = _ms(exp.ended or time.time())
            if exp.id in self.series:  # every point, at the time its line was read
                points_of = {_key(name): [(step, value, _ms(wall)) for step, value, wall in got]
                             for name, got in series_points(self.series[exp.id]).items()}
            else:  # the registry's series, which keep no time per point
                points_of = {key: [(step, value, stamp) for step, value in got]
                             for key, got in metric_points(self.registry.metrics(exp.id)).items()}
            new_metrics = []
            for key, points in points_of.items():
                seen = set() if created else {m.step for m in self.client.get_metric_history(run_id, key)}
                new_metrics += [Metric(key, value, at, step) for step, value, at in points if step not in seen]
            step = PER_BATCH["params"]
            for i in range(0, max(len(new_params), len(new_tags)), step):
                self.client.log_batch(run_id, params=new_params[i:i + step], tags=new_tags[i:i + step])
            step = PER_BATCH["metrics"]
            for i in range(0, len(new_metrics), step):
                self.client.log_batch(run_id, metrics=new_metrics[i:i + step])
            moved = self._status(run, exp)
            if created or moved or new_params or new_tags or new_metrics:
                self.runs[exp.id] = self.client.get_run(run_id)
        what = "new" if created else "updated" if moved or new_params or new_tags or new_metrics else "unchanged"
        return {"experiment": exp.id, "run_id": run_id, "run": what, "params": len(new_params),
                "metrics": len(new_metrics), "params_kept": kept}

    def _status(self, run: Any, exp: Experiment) -> bool:
        """The run's status and end time set to the record's; whether they changed."""
        status = STATUS.get(exp.status, "RUNNING")
        end = _ms(exp.ended) if exp.status in FINAL else None
        if run.info.status == status and (end is None or run.info.end_time == end):
            return False
        if exp.status in FINAL:
            self.client.set_terminated(run.info.run_id, status, end_time=end)
        else:
            self.client.update_run(run.info.run_id, status=status)
        return True

    def log_done(self, exp: Experiment) -> bool:
        """Whether the run already holds the whole log of an experiment that has ended."""
        run = self.runs.get(exp.id)
        return run is not None and run.data.tags.get("orch.log") == "complete"

    def upload_log(self, exp: Experiment, path: Path) -> None:
        run_id = self.runs[exp.id].info.run_id
        with _translated(self.uri):
            self.client.log_artifact(run_id, str(path))
            if exp.status in FINAL:
                self.client.set_tag(run_id, "orch.log", "complete")
            self.runs[exp.id] = self.client.get_run(run_id)


def _artifacts(uri: str) -> str | None:
    """Where a new experiment in a SQLite store keeps its artifacts: beside the database (MLflow's default
    is ``./mlruns`` under whatever folder the command ran in)."""
    if uri.startswith("sqlite:///") and uri[len("sqlite:///"):] not in ("", ":memory:"):
        return str(Path(uri[len("sqlite:///"):]).resolve().parent / "mlflow-artifacts")
    return None


def _with_parents(registry: Registry, exps: list[Experiment], present: dict[int, Any]) -> list[Experiment]:
    """``exps`` and, before them, every ancestor not in MLflow yet, parents first (a parent's id is lower)."""
    chosen = {e.id: e for e in exps}
    for exp in exps:
        parent = exp.parent
        while parent and parent not in chosen and parent not in present:
            try:
                chosen[parent] = registry.get(parent)
            except NotFoundError:
                break
            parent = chosen[parent].parent
    return [chosen[i] for i in sorted(chosen)]


def export(settings: Settings, registry: Registry, ids: list[int] | None, *, uri: str,
           refresh: Callable[[list[Experiment]], None] | None, resolve: Callable[[Experiment], Target] | None,
           notice: Callable[[str], None],
           series: Callable[[list[Experiment]], dict[int, list]] | None = None) -> dict:
    """Write experiments ``ids`` (default: all; and any ancestor MLflow lacks) as MLflow runs.

    Once MLflow answers, ``refresh`` brings their metrics up to date and ``series`` reads the series their
    supervisors kept (every point, at its time; the registry's series where it has none); with ``resolve``, each
    run's log is read from its target and uploaded too (an ended one's once). A target that cannot be reached is said
    through ``notice``, and everything else is exported all the same."""
    _library()  # before anything is read or written
    exps = [registry.get(i) for i in dict.fromkeys(ids)] if ids else sorted(registry.list(), key=lambda e: e.id)
    with _locked(settings.state_dir):
        exporter = Exporter(settings, registry, uri)
        if refresh is not None:
            refresh(exps)
        todo = _with_parents(registry, [registry.get(e.id) for e in exps], exporter.runs)
        if series is not None:  # every point at its time, where the run's supervisor kept its series
            exporter.series = series(todo)
        done = [exporter.export(exp) for exp in todo]
        logs = _logs(settings, registry, exporter, todo, resolve, notice) if resolve else {}
    registry.changed -= {e.id for e in todo}  # in MLflow as they are now: a mirror has nothing to add
    for row in done:
        row["log"] = logs.get(row["experiment"], "not read")
    return {"uri": shown(uri), "experiment": exporter.name, "experiment_id": exporter.experiment_id,
            "runs": done}


def _logs(settings: Settings, registry: Registry, exporter: Exporter, exps: list[Experiment],
          resolve: Callable[[Experiment], Target], notice: Callable[[str], None]) -> dict[int, str]:
    """Each experiment's log uploaded as ``train.log``, one connection per target; what became of each."""
    from ..records.reconcile import client_for

    out: dict[int, str] = {}
    groups: dict[str, list[Experiment]] = {}
    for exp in exps:
        if exporter.log_done(exp):
            out[exp.id] = "unchanged"
        else:
            groups.setdefault(exp.target, []).append(exp)
    for name, group in groups.items():
        ids = ", ".join(str(e.id) for e in group)
        try:
            target = resolve(group[0])
            client = client_for(settings, target, read_only=True)
        except OrchError as exc:
            notice(f"orch: the log of experiment(s) {ids} on {name} is not exported: {exc.message} (the rest is)")
            out.update({e.id: f"not exported: {exc.message}" for e in group})
            continue
        try:
            for exp in group:
                with tempfile.TemporaryDirectory(prefix="orch-mlflow-") as folder:
                    path = Path(folder) / LOG_NAME
                    try:
                        size = _read_log(client, registry, exp, path)
                    except NotFoundError:
                        out[exp.id] = "none (no run folder on its target)"
                        continue
                    exporter.upload_log(exp, path)
                    out[exp.id] = f"{size} bytes"
        except OrchError as exc:
            notice(f"orch: the log of experiment(s) {ids} on {name} is not exported: {exc.message} (the rest is)")
            out.update({e.id: f"not exported: {exc.message}" for e in group if e.id not in out})
        finally:
            client.transport.close()
    return out


def _read_log(client: Any, registry: Registry, exp: Experiment, path: Path) -> int:
    """The run's whole log into ``path``, a chunk at a time (bounded memory); returns its size."""
    from ..reach.agent_client import decode_log

    offset, identity = 0, None
    with open(path, "wb") as f:
        while True:
            value = client.one("log_read", exp_id=exp.id, registry=registry.run_registry(exp.id), offset=offset,
                               identity=identity, max_bytes=CHUNK)
            if value["reset"]:  # the log was replaced under us: read it again from its start
                f.seek(0)
                f.truncate()
            data = decode_log(value)
            f.write(data)
            offset, identity = value["offset"], value["identity"]
            if not data or offset >= value["size"]:
                return offset


def mirror(settings: Settings, registry: Registry, ids: list[int], notice: Callable[[str], None]) -> None:
    """``[mlflow] mirror``: the experiments a command changed, mirrored as it ends (no log: that is
    ``orch experiments export``'s). Never raises: a failure is one warning line."""
    uri = tracking_uri(settings)
    try:
        _library()
        with _locked(settings.state_dir):
            exporter = Exporter(settings, registry, uri)
            for exp in _with_parents(registry, [registry.get(i) for i in ids], exporter.runs):
                exporter.export(exp)
    except OrchError as exc:
        notice(f"orch: warning: experiment(s) {', '.join(map(str, ids))} not mirrored to MLflow ({shown(uri)}): "
               f"{exc.message}" + (f"; hint: {exc.hint}" if exc.hint else ""))
    except Exception as exc:  # an MLflow failure orch does not know yet: the command's work stands
        notice(f"orch: warning: experiment(s) {', '.join(map(str, ids))} not mirrored to MLflow ({shown(uri)}): "
               f"{type(exc).__name__}: {exc}")
