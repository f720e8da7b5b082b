"""What ``orch ui``'s pages read from the registry, each answer from one read-only connection held for one read.

Every answer is the CLI's where the CLI has one: ``experiments`` is ``orch experiments list --json``,
``experiment`` is ``orch experiments show --json`` (with the stored series beside it), made by the same
functions; ``curves`` are the series a comparison or a sweep overlays (the comparison itself is the CLI's,
``actions.py``). ``table`` is the dashboard's own narrow view of the list: one row per experiment with the
columns it shows.
The registry never holds a secret's value or a webhook URL, so neither can reach a page.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

from ..config import Settings
from ..errors import NotFoundError
from ..records.experiments import Registry

# a series whose name says it was measured on held-out data: the table's "eval loss" column
EVAL_LOSS = ("eval_loss", "val_loss", "valid_loss", "validation_loss", "test_loss")


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


def _throughput(summary: dict) -> dict | None:
    for key, unit in (("median_tok_s", "tok/s"), ("median_steps_s", "steps/s")):
        if summary.get(key) is not None:
            return {"value": summary[key], "unit": unit}
    return None


def _eval_loss(summary: dict) -> float | None:
    for key in EVAL_LOSS:
        if isinstance(summary.get(key), (int, float)):
            return summary[key]
    return None


_TABLES: dict[tuple, list[dict]] = {}  # the last table read, by the registry files' state and the limit


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


def table(settings: Settings, limit: int = 1000) -> dict:
    """The experiments table: the newest ``limit`` rows, only the columns the page shows. Read again only when
    the registry's files changed since the last read (a launch in flight is always read anew)."""
    key = (str(settings.state_dir), limit, _files_state(settings))
    rows = _TABLES.get(key)
    if rows is None:
        rows = _table_rows(settings, limit)
        _TABLES.clear()
        if not any(r["state"] in ("launching", "orphaned") for r in rows):
            _TABLES[key] = rows
    return {"rows": rows, "now": time.time(), "project": settings.project.name}


def _table_rows(settings: Settings, limit: int) -> list[dict]:
    with reading(settings) as reg:
        if reg is None:
            return []
        found = reg.overview(limit, ("loss", "median_tok_s", "median_steps_s", *EVAL_LOSS))
    rows = []
    for r in found:
        s = r["summary"]
        rows.append({"id": r["id"], "state": "orphaned" if r["orphaned"] else r["status"], "message": r["message"],
                     "target": r["target"], "ct": r["ct"], "gpus": [g.get("index") for g in r["gpus"]],
                     "strategy": r["strategy"], "sweep": r["sweep"], "throughput": _throughput(s),
                     "loss": s.get("loss"), "eval_loss": _eval_loss(s), "started": r["started"], "ended": r["ended"],
                     "created": r["created"]})
    return rows


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
        data["series"] = series_points(reg.metrics(exp_id))
        data["orphaned"] = reg.orphaned(exp)
    return data


def curves(settings: Settings, ids: list[int]) -> dict:
    """Each experiment's stored series and message, to overlay beside ``orch experiments compare --json`` or
    ``orch sweep show --json``."""
    with reading(settings) as reg:
        if reg is None:
            raise NotFoundError("nothing is recorded yet", hint="orch deploy starts an experiment")
        exps = {i: reg.get(i) for i in ids}
        now = time.time()
        return {"series": {str(i): series_points(reg.metrics(i)) for i in ids},
                "messages": {str(i): e.message for i, e in exps.items()},
                # when each ran (a live one: until now): the page's time axis spreads its steps over it
                "spans": {str(i): [e.started, e.ended or (now if e.status in ("running", "lost") else None)]
                          for i, e in exps.items()}}


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
