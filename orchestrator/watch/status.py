"""What a target's latest run is doing, as ``orch status`` reports it: one read, a watch, every target at once.

A read brings the registry's unsettled rows on that machine up to date (``records.reconcile.target_status``),
then reads what is new in the run's log for its metrics, and answers one flat dict (the ``--json`` form).
The caller says how a target is chosen (``resolve``), how the registry is opened (``open_registry``) and how
a notice reaches the user, so this module knows nothing of flags or terminals.
"""

from __future__ import annotations

import time
from typing import Any, Callable, ContextManager

from ..config import Settings
from ..records.experiments import Experiment, Registry
from ..reach.targets import Target

WATCH_INTERVAL_S = 2.0  # `orch status --watch`: between reads, and before a retry after a dropped connection
MAX_AT_ONCE = 64  # `status --all`: targets asked at once (each thread mostly waits on its target)

OpenRegistry = Callable[[], ContextManager[Registry]]


def as_dict(st: dict) -> dict:
    """``target_status``'s answer (with its metrics ``summary``) as the flat dict status shows."""
    exp, run = st["experiment"], st["run"] or {}
    age = (st["now"] - run["log_mtime"]) if run.get("log_mtime") else None
    return {"target": st["target"], "target_label": st["label"], "target_info": st["info"],
            "experiment": exp.id if exp else None,
            "state": (exp.status if exp else None), "exit_code": exp.exit_code if exp else None,
            "end_reason": exp.end_reason if exp else None, "ended": exp.ended if exp else None,
            "revision": exp.revision if exp else None, "message": exp.message if exp else None,
            "started": exp.started if exp else None, "last_line": run.get("last_line"),
            "log_age_s": age, "log_bytes": run.get("log_size"), "summary": st.get("summary") or {},
            "gpus": st.get("gpus", []), "run_gpus": exp.gpus if exp else None,
            "phase": run.get("phase"), "attempt": run.get("attempt"),
            "max_attempts": run.get("max_attempts"), "last_reason": run.get("last_reason"),
            "resumed_from": run.get("resumed_from"), "notify": run.get("notify"), "queue": st.get("queue", []),
            "guard": run.get("guard"),
            "live": [{"experiment": e.id, "state": e.status, "gpus": [g.get("index") for g in e.gpus or []],
                      "revision": e.revision, "message": e.message, "started": e.started,
                      "checkpoints": e.checkpoints} for e in st.get("live") or []]}


def read(settings: Settings, target: Target, registry: Registry, client, *, metrics: bool,
         experiment: int | None = None) -> dict:
    """One status of ``target`` (its latest experiment, or ``experiment``): its rows reconciled, and (``metrics``)
    what is new in the log read."""
    from ..records.reconcile import target_status
    from . import metrics_view

    from . import gpu_use

    st = target_status(settings, target, registry, client, experiment)
    if metrics:
        st["summary"] = metrics_view.refresh(settings, target, registry, client, st["experiment"], now=st["now"])
    notes = gpu_use.record(registry, st["experiment"], st.get("gpus") or [], settings.metrics.gpu_idle_after,
                           st["now"])
    if notes:
        st["summary"] = {**(st.get("summary") or {})}
        st["summary"]["notes"] = [*(st["summary"].get("notes") or []), *notes]
    return as_dict(st)


def watch(settings: Settings, target: Target, open_registry: OpenRegistry, *, metrics: bool,
          show: Callable[[dict], None], notice: Callable[[str], None], repeat: bool,
          experiment: int | None = None) -> None:
    """``show`` one read of ``target``; ``repeat``: a read every 2 s until interrupted, and a dropped connection
    is said (``notice``) and opened again rather than ending the watch."""
    from ..errors import TransportError
    from ..records.reconcile import client_for

    client = None
    try:
        while True:
            try:
                client = client or client_for(settings, target, read_only=True)
                with open_registry() as reg:
                    data = read(settings, target, reg, client, metrics=metrics, experiment=experiment)
            except TransportError as exc:
                if not repeat:
                    raise
                notice(f"orch: connection lost ({exc.message}); retrying in {WATCH_INTERVAL_S:g} s")
                if client is not None:
                    client.transport.close()
                client = None
                time.sleep(WATCH_INTERVAL_S)
                continue
            show(data)
            if not repeat:
                break
            time.sleep(WATCH_INTERVAL_S)
    finally:
        if client is not None:
            client.transport.close()


def read_all(settings: Settings, open_registry: OpenRegistry,
             resolve: Callable[[str | None, int | None], Target], read_job: Callable[[Experiment, Registry], Any], *,
             metrics: bool) -> list[dict]:
    """One status per machine this project has run on, all asked at once (an unreachable one costs its own
    timeout and says why in ``error``; the rest go on). A job's entry has its nodes (``nodes``, ``job``):
    ``read_job(exp, registry)`` answers (its group, the job's settled row), asking every node."""
    from concurrent.futures import ThreadPoolExecutor

    with open_registry() as reg:
        latest: dict = {}
        for exp in reg.list(limit=500):
            latest.setdefault(exp.machine or exp.target, exp)
    exps = [exp for _, exp in sorted(latest.items())]
    with ThreadPoolExecutor(max_workers=max(1, min(MAX_AT_ONCE, len(exps)))) as pool:
        return list(pool.map(lambda exp: _read_one(settings, exp, open_registry, resolve, read_job, metrics),
                             exps))


def _read_one(settings: Settings, exp: Experiment, open_registry: OpenRegistry, resolve, read_job,
              metrics: bool) -> dict:
    """``read`` of the target ``exp`` ran on (a job: its nodes), or what is recorded and why not."""
    from ..errors import OrchError
    from ..records.reconcile import client_for
    from . import metrics_view

    client = None
    try:
        if exp.nodes:
            with open_registry() as reg:
                grp, job_exp = read_job(exp, reg)
            return {"target": grp.name, "target_label": grp.label, "experiment": job_exp.id,
                    "state": job_exp.status, "exit_code": job_exp.exit_code, "nodes": job_exp.nodes, "job": job_exp}
        tgt = resolve(*metrics_view.target_flags(settings, exp))
        client = client_for(settings, tgt, read_only=True)
        with open_registry() as reg:
            return read(settings, tgt, reg, client, metrics=metrics)
    except OrchError as exc:
        return {"target": exp.target, "target_label": exp.target, "experiment": exp.id,
                "state": exp.status, "exit_code": exp.exit_code, "error": exc.message}
    finally:
        if client is not None:
            client.transport.close()
