"""A run's whole metric series as its supervisor kept it (``agent/run/series.py``), read from the target: every
event with the time it was read, for the exports that want every point and its time (TensorBoard, MLflow).

A run whose series is not there (an older orch's supervisor, a run folder collected), an ended run whose series
stops short of its log, or one whose metrics come from ``[metrics] patterns`` (which need the log's lines) has none
here: the export falls back to the registry's series.
"""

from __future__ import annotations

from typing import Callable

from ..config import Settings
from ..errors import OrchError
from ..reach.agent_client import Op
from ..reach.targets import Target
from ..records.experiments import ENDED, Experiment, Registry
from .metrics_view import SERIES_CHUNK, as_recorded, kept_records


def records_of(settings: Settings, registry: Registry, exps: list[Experiment],
               resolve: Callable[[Experiment], Target], notice: Callable[[str], None]) -> dict[int, list]:
    """``{experiment id: [[log offset, time, event], ...]}`` for each of ``exps`` whose series its target keeps;
    one connection per target, an unreachable one reported through ``notice``."""
    from ..records.reconcile import client_for

    todo: dict[str, list[Experiment]] = {}
    for exp in exps:
        if not as_recorded(settings, exp).metrics.patterns:
            todo.setdefault(exp.target, []).append(exp)
    out: dict[int, list] = {}
    for name, group in todo.items():
        try:
            client = client_for(settings, resolve(group[0]), read_only=True)
        except OrchError as exc:
            notice(f"series of experiment(s) {', '.join(str(e.id) for e in group)} not read: {exc.message}")
            continue
        try:
            for exp in group:
                found = _records(registry, client, exp)
                if found is not None:
                    out[exp.id] = found
        except OrchError as exc:
            notice(f"series on target {name} not read: {exc.message}")
        finally:
            client.transport.close()
    return out


def _records(registry: Registry, client, exp: Experiment) -> list | None:
    """The series of ``exp`` from its start, a chunk per agent call; None where its target keeps none."""
    records: list = []
    context: dict = {}
    offset = 0
    while True:
        op = Op("log_read", {"exp_id": exp.id, "registry": registry.run_registry(exp.id), "offset": 0,
                             "identity": None, "max_bytes": SERIES_CHUNK, "series_offset": offset})
        try:
            value = client.call([op])[0]
        except OrchError:
            return None  # no run folder there: what the registry keeps is all there is
        kept = value.get("series")
        if kept is None:
            return None
        records += kept_records(kept["data"], context)
        if kept["offset"] <= offset or kept["offset"] >= kept["size"]:
            # an ended run's series that stops short of its log (its supervisor's last read not saved yet, or
            # never: killed) has less than the log: the registry's series, read from the log, is exported instead
            ended = (value.get("state") or {}).get("state") in ENDED
            return records if kept.get("whole") or not ended else None
        offset = kept["offset"]


def points_of(records: list) -> dict[str, list[tuple[int, float, float]]]:
    """A run's series (``[log offset, time, event]`` each) as each metric's (step, value, wall time) points, one per
    step (the last value a step had), the steps as the registry's series place them (``metrics_view.add_events``:
    an event without a step at the last training step before it; an evaluation bar's counts are no steps)."""
    from .metrics_view import COUNTERS, MAX_SERIES, _evaluation_bar

    state: dict = {}
    by_name: dict[str, dict[int, tuple[float, float]]] = {}
    seen = 0
    for _, wall, ev in records:
        if _evaluation_bar(ev, state):
            continue
        if "step" in ev:
            state["last_step"] = ev["step"]
        if "total_steps" in ev:
            state["total_steps"] = ev["total_steps"]
        x = int(round(state["last_step"] if state.get("last_step") is not None else seen))
        seen += 1
        for key, value in ev.items():
            if key in COUNTERS or (key not in by_name and len(by_name) >= MAX_SERIES):
                continue
            by_name.setdefault(key, {})[x] = (float(value), float(wall))
    return {name: [(step, v, t) for step, (v, t) in sorted(points.items())] for name, points in by_name.items()}
