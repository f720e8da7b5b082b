"""What a target's latest run is doing, as ``orch status`` reports it: one read, a watch, every target at once.

A read brings the registry's unsettled rows on that machine up to date (``records.reconcile``'s
``status_asked``/``status_answered``) and reads what is new in the run's log for its metrics, both in one agent
call (the log read its refresh starts with is asked ahead), and answers one flat dict (the ``--json`` form).
What the target said is recorded in short write transactions after its answers are in, never around an agent
call: a status waiting on a slow target holds up no other command on the registry.
The caller says how a target is chosen (``resolve``), how the registry is opened (``open_registry``) and how
a notice reaches the user, so this module knows nothing of flags or terminals.
"""

from __future__ import annotations

import time
from typing import Any, Callable, ContextManager, Iterator

from ..config import Settings
from ..records.experiments import Experiment, Registry
from ..reach.targets import Target

WATCH_INTERVAL_S = 2.0  # `orch status --watch`: between reads, and before a retry after a dropped connection
MAX_AT_ONCE = 64  # `status --all`: targets asked at once (each thread mostly waits on its target)
HOLD_S = 0.3  # `status --all`: the answers recorded in one transaction are those within this of its first

OpenRegistry = Callable[[], ContextManager[Registry]]


def as_dict(st: dict) -> dict:
    """``status_answered``'s answer (with its metrics ``summary``) as the flat dict status shows."""
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
            "slurm": run.get("slurm") or ((exp.target_info or {}).get("slurm") if exp else None),
            "live": [{"experiment": e.id, "state": e.status, "gpus": [g.get("index") for g in e.gpus or []],
                      "revision": e.revision, "message": e.message, "started": e.started,
                      "checkpoints": e.checkpoints} for e in st.get("live") or []]}


def read(settings: Settings, target: Target, registry: Registry, client, *, metrics: bool,
         experiment: int | None = None) -> dict:
    """One status of ``target`` (its latest experiment, or ``experiment``): its rows reconciled, and (``metrics``)
    what is new in the log read; one agent call asks for both. What it said of the rows is recorded in one
    transaction, then the log read (any further call made first) in another."""
    asked = _ask(settings, target, registry, metrics=metrics, experiment=experiment)
    values = _call(settings, client, asked)
    with registry.batch():
        settled = _settle(settings, target, registry, asked, values, experiment=experiment)
    return _answer(settings, target, registry, client, asked, settled, metrics=metrics)


def _ask(settings: Settings, target: Target, registry: Registry, *, metrics: bool,
         experiment: int | None) -> tuple:
    """(``status_asked``'s request, the log read asked ahead in it or None): reconcile's ops and the latest runs,
    then (``metrics``) the read its refresh starts with of the experiment it will most likely show."""
    from ..errors import NotFoundError
    from ..records.reconcile import status_asked
    from . import metrics_view

    ahead = None
    if metrics:
        try:
            slurm = target.spec.kind == "slurm"  # a job pending for its nodes is what the cluster runs next
            exp = registry.latest(target.machine, target.name, queued=slurm) if experiment is None \
                else registry.get(experiment)
        except NotFoundError:
            exp = None  # said once the target has been asked, as before
        ahead = metrics_view.first_read(settings, registry, exp) if exp is not None else None
    return status_asked(settings, target, registry, experiment, also=[ahead] if ahead else []), ahead


def _call(settings: Settings, client, asked: tuple) -> list:
    """The read's one agent call; a log read ahead that finds no run folder answers None (the refresh asks again
    and says so)."""
    from ..errors import NotFoundError
    from ..records.reconcile import call

    request, ahead = asked
    try:
        return call(settings, client, request)
    except NotFoundError as exc:
        if ahead is None or len(exc.partial) != len(request.ops) - 1:
            raise
        return [*exc.partial, None]


def _settle(settings: Settings, target: Target, registry: Registry, asked: tuple, values: list, *,
            experiment: int | None) -> tuple:
    """What the call said of the rows, recorded (``status_answered``): (its answer, the values of the reads
    asked ahead). Only writes: its caller holds a write transaction around it, never around an agent call."""
    from ..records.reconcile import status_answered

    return status_answered(settings, target, registry, asked[0], values, experiment)


def _answer(settings: Settings, target: Target, registry: Registry, client, asked: tuple, settled: tuple, *,
            metrics: bool) -> dict:
    """The read from its settled rows: the log read (from the value asked ahead where it is the read needed; the
    refresh makes any further agent call before its own short write), the GPUs recorded."""
    from . import gpu_use, metrics_view

    ahead = asked[1]
    st, rest = settled
    if metrics:
        got = (ahead, rest[0]) if ahead is not None and rest[0] is not None else None
        st["summary"] = metrics_view.refresh(settings, target, registry, client, st["experiment"], now=st["now"],
                                             ahead=got)
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
    ``read_job(exp, registry)`` answers (its group, the job's settled row), asking every node.

    The targets are reached and asked in parallel, one agent call each, with one registry, only read while no
    answer is in; what they said is recorded as they answer, those that come together in one transaction.
    """
    from concurrent.futures import ThreadPoolExecutor

    with open_registry() as reg:
        exps = reg.latest_by_place(window=500)
        readings = [_Reading(exp) for exp in exps if not exp.nodes]
        with ThreadPoolExecutor(max_workers=max(1, min(MAX_AT_ONCE, len(exps)))) as pool:
            jobs = {exp.id: pool.submit(_read_job, settings, exp, open_registry, read_job) for exp in exps
                    if exp.nodes}
            try:
                list(pool.map(lambda r: r.step(_reach, settings, r, resolve), readings))
                calls = {}
                for r in readings:  # each target asked as soon as its request is made
                    r.asked = r.step(_ask, settings, r.target, reg, metrics=metrics, experiment=None)
                    if r.failed is None:
                        calls[pool.submit(lambda r: setattr(r, "values", r.step(_call, settings, r.client, r.asked)),
                                          r)] = r
                shown = {}

                def settle(r: _Reading) -> None:
                    r.settled = r.step(_settle, settings, r.target, reg, r.asked, r.values, experiment=None)

                for answered in _as_answered(reg, calls, settle):
                    for r in answered:  # the transaction that recorded them is over: a log read waits on no one
                        shown[r.exp.id] = r.step(_answer, settings, r.target, reg, r.client, r.asked, r.settled,
                                                 metrics=metrics)
                shown.update({exp_id: job.result() for exp_id, job in jobs.items()})
                shown.update({r.exp.id: r.failed for r in readings if r.failed is not None})
            finally:
                list(pool.map(_Reading.close, readings))
    return [shown[exp.id] for exp in exps]


def _as_answered(registry: Registry, calls: dict, settle: Callable[[Any], None]) -> Iterator[list]:
    """The readings whose calls have answered, in groups, each ``settle``d in one transaction (``registry.batch``)
    and yielded once it is committed: one opens at the first answer and takes those that come within ``HOLD_S`` of
    it, so a slow target never keeps the registry locked while it is waited for."""
    from concurrent.futures import FIRST_COMPLETED, wait

    pending = set(calls)
    while pending:
        done, pending = wait(pending, return_when=FIRST_COMPLETED)  # nothing held while none has answered
        group = []
        with registry.batch():
            until = time.monotonic() + HOLD_S
            while True:
                for future in done:
                    future.result()
                    settle(calls[future])
                    group.append(calls[future])
                if not pending or time.monotonic() >= until:
                    break
                done, pending = wait(pending, timeout=until - time.monotonic(), return_when=FIRST_COMPLETED)
                if not done:
                    break
        yield group


class _Reading:
    """One target of ``read_all`` through its steps; the first orch error ends them, and it is shown unreachable."""

    def __init__(self, exp: Experiment) -> None:
        self.exp = exp
        self.target: Target | None = None
        self.client: Any = None
        self.asked: Any = None
        self.values: Any = None
        self.settled: Any = None
        self.failed: dict | None = None

    def step(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """``fn``'s value; None once a step failed."""
        from ..errors import OrchError

        if self.failed is not None:
            return None
        try:
            return fn(*args, **kw)
        except OrchError as exc:
            self.failed = _unreachable(self.exp, exc)
            return None

    def close(self) -> None:
        if self.client is not None:
            self.client.transport.close()


def _reach(settings: Settings, reading: _Reading, resolve) -> None:
    """The target ``reading``'s experiment ran on, and a client to it."""
    from ..records.reconcile import client_for
    from . import metrics_view

    reading.target = resolve(*metrics_view.target_flags(settings, reading.exp))
    reading.client = client_for(settings, reading.target, read_only=True)


def _read_job(settings: Settings, exp: Experiment, open_registry: OpenRegistry, read_job) -> dict:
    """A job's entry: every node asked (``read_job``), or what is recorded and why not."""
    from ..errors import OrchError

    try:
        with open_registry() as reg:
            grp, job_exp = read_job(exp, reg)
    except OrchError as exc:
        return _unreachable(exp, exc)
    return {"target": grp.name, "target_label": grp.label, "experiment": job_exp.id,
            "state": job_exp.status, "exit_code": job_exp.exit_code, "nodes": job_exp.nodes, "job": job_exp}


def _unreachable(exp: Experiment, exc) -> dict:
    return {"target": exp.target, "target_label": exp.target, "experiment": exp.id,
            "state": exp.status, "exit_code": exp.exit_code, "error": exc.message}
