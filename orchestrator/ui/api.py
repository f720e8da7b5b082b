"""What ``orch ui``'s pages read from the registry, each answer from one read-only connection held for one read.

Every answer is the CLI's where the CLI has one: ``experiments`` is ``orch experiments list --json``,
``experiment`` is ``orch experiments show --json`` (with the stored series beside it), made by the same
functions; ``curves`` are the series a comparison or a sweep overlays (the comparison itself is the CLI's,
``actions.py``). ``table`` is the dashboard's own narrow view of the list: one row per experiment with the
columns it shows.
The registry never holds a secret's value or a webhook URL, so neither can reach a page.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from typing import Iterator

from ..config import Settings
from ..errors import NotFoundError
from ..records.experiments import Registry
from ..watch.metrics import better


@contextmanager
def reading(settings: Settings) -> Iterator[Registry | None]:
    """The registry opened read-only (None before the first experiment is recorded)."""
    try:
        reg = Registry(settings.state_dir / "experiments.db", read_only=True)
    except NotFoundError:
        yield None
        return
    try:
        yield reg
    finally:
        reg.close()


def experiments(settings: Settings, target: str | None = None, limit: int = 50) -> list[dict]:
    """``orch experiments list --json``."""
    from ..records.experiments import listing

    with reading(settings) as reg:
        return [] if reg is None else listing(reg, reg.list(target=target, limit=limit))


_TABLES: dict[tuple, dict] = {}  # the last pages read, by the registry files' state and what was asked


def _files_state(settings: Settings) -> tuple:
    """What changes whenever the registry does: its file's and its write-ahead log's size and time."""
    out = []
    for name in ("experiments.db", "experiments.db-wal"):
        try:
            st = (settings.state_dir / name).stat()
            out.append((st.st_size, st.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)


def table(settings: Settings, offset: int = 0, limit: int = 100, sort: str = "id", desc: bool = True,
          filters: dict[str, str] | None = None) -> dict:
    """One page of the experiments table (``records.table.page``), only the columns the page shows. Read again
    only when the registry's files changed since the last read (a launch in flight is always read anew)."""
    from ..records.table import page

    filters = {k: v for k, v in (filters or {}).items() if v}
    key = (str(settings.state_dir), offset, limit, sort, desc, tuple(sorted(filters.items())), _files_state(settings))
    found = _TABLES.get(key)
    if found is None:
        with reading(settings) as reg:
            found = {"rows": [], "total": 0} if reg is None else page(reg, offset=offset, limit=limit, sort=sort,
                                                                        desc=desc, filters=filters)
        if len(_TABLES) > 32:
            _TABLES.clear()
        if not any(r["state"] in ("launching", "orphaned") for r in found["rows"]):
            _TABLES[key] = found
    return {**found, "offset": offset, "limit": limit, "sort": sort, "desc": desc, "now": time.time(),
            "project": settings.project.name}


def series_points(stored: dict | None) -> dict[str, list]:
    """Every stored metric series by its name (whatever names the log gave), as [[x, y], ...]."""
    from ..watch.metrics import Series

    out = {}
    for name, data in ((stored or {}).get("series") or {}).items():
        try:
            out[name] = [list(p) for p in Series.from_dict(data).points()]
        except Exception:  # a malformed stored series: the page shows the others
            continue
    return out


def experiment(settings: Settings, exp_id: int) -> dict:
    """``orch experiments show --json`` plus the stored series and the siblings a page links to."""
    from ..records.experiments import record

    with reading(settings) as reg:
        if reg is None:
            raise NotFoundError(f"no experiment {exp_id}: nothing is recorded yet", hint="orch deploy starts one")
        exp = reg.get(exp_id)
        data = record(reg, exp)
        stored = reg.metrics(exp_id)
        data["series"] = series_points(stored)
        data["axes"] = axes(exp, stored, time.time())
        data["better"] = {name: better(name) for name in data["series"]}
        data["orphaned"] = reg.orphaned(exp)
    return data


def axes(exp, stored: dict | None, now: float) -> dict:
    """Where a run's steps lie in time and in tokens, as [[step, seconds since its start], ...] and
    [[step, tokens], ...], for a chart's x-axis. The registry keeps each point's step only, so these are its
    ends: the first step at the start, the last at its end (a live one: now); tokens from the last count the log
    printed (through 0 at step 0). Empty where unknown; the live view adds what it reads as the run prints."""
    summary = (stored or {}).get("summary") or {}
    state = summary.get("_state") or {}
    first, last = state.get("first_step"), summary.get("step") if summary.get("step") is not None \
        else state.get("last_step")
    out: dict[str, list] = {"time": [], "tokens": []}
    end = exp.ended or (now if exp.status in ("running", "lost") else (stored or {}).get("updated"))
    if exp.started and end and last is not None:
        out["time"] = [[float(first if first is not None else 0), 0.0], [float(last), max(0.0, end - exp.started)]]
    tokens = state.get("tokens") or summary.get("tokens")
    if tokens and last:
        out["tokens"] = [[0.0, 0.0], [float(last), float(tokens)]]
    return out


def curves(settings: Settings, ids: list[int]) -> dict:
    """Each experiment's stored series and message, to overlay beside ``orch experiments compare --json`` or
    ``orch sweep show --json``."""
    with reading(settings) as reg:
        if reg is None:
            raise NotFoundError("nothing is recorded yet", hint="orch deploy starts an experiment")
        exps = {i: reg.get(i) for i in ids}
        now = time.time()
        stored = {i: reg.metrics(i) for i in ids}
        series = {str(i): series_points(stored[i]) for i in ids}
        return {"series": series,
                "axes": {str(i): axes(exps[i], stored[i], now) for i in ids},
                "better": {n: better(n) for points in series.values() for n in points},
                # every setting of each run, flattened (batching.strategy, ...): what a chart groups runs by
                "settings": {str(i): settings_of(e) for i, e in exps.items()},
                "messages": {str(i): e.message for i, e in exps.items()},
                # when each ran (a live one: until now): the page's time axis spreads its steps over it
                "spans": {str(i): [e.started, e.ended or (now if e.status in ("running", "lost") else None)]
                          for i, e in exps.items()}}


def settings_of(exp) -> dict[str, str]:
    """The settings a run was launched with, flattened to ``section.key`` -> text (its batching first)."""
    out: dict[str, str] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif len(out) < 500:
            out[prefix] = value if isinstance(value, str) else json.dumps(value)

    walk("batching", exp.batching or {})
    walk("", exp.config or {})
    return out


def gpu_use(settings: Settings, limit: int = 200) -> dict:
    """Who holds which GPU (the live experiments given GPUs) and each one's utilisation over time."""
    live = ("running", "launching")
    with reading(settings) as reg:
        if reg is None:
            return {"holders": []}
        holders = []
        for e in reg.list(limit=limit):
            if not e.gpus:
                continue
            holders.append({"id": e.id, "state": e.status, "live": e.status in live, "target": e.target,
                            "message": e.message, "gpus": e.gpus, "series": e.gpu_series or []})
    return {"holders": holders}


def queued(settings: Settings) -> dict:
    """The experiments the registry has as queued, by target, oldest first (``orch queue`` asks the target)."""
    with reading(settings) as reg:
        if reg is None:
            return {"targets": {}}
        out: dict[str, list] = {}
        for e in sorted(reg.list(status="queued"), key=lambda e: e.id):
            out.setdefault(e.target, []).append({"id": e.id, "message": e.message, "sweep": e.sweep,
                                                 "created": e.created, "revision": e.revision[:10]})
    return {"targets": out}
