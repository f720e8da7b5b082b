"""The dashboard's experiments table, a page at a time: filtered, sorted and cut in one query, so a page costs
the rows it shows (plus one count), however long the project's history.

    with Registry(path, read_only=True) as reg:
        page(reg, sort="best:loss", offset=0, limit=100, filters={"state": "finished"})

Only the column names below can be sorted on, and every filter's value is a bound parameter.
"""

from __future__ import annotations

import json
from typing import Any

from .experiments import Registry
from .launch_guard import launcher_alive

# a series whose name says it was measured on held-out data: the table's "eval loss" column
EVAL_LOSS = ("eval_loss", "val_loss", "valid_loss", "validation_loss", "test_loss")


def _summary(path: str) -> str:
    return f"json_extract(m.summary, '$.{path}')"


def _first(*paths: str) -> str:
    return f"COALESCE({', '.join(_summary(p) for p in paths)})"


# the sortable columns, each an SQL expression over the experiment (e) and its metric summary (m)
COLUMNS: dict[str, str] = {
    "id": "e.id",
    "state": "e.status",
    "message": "e.message COLLATE NOCASE",
    "target": "e.target",
    "batching": "json_extract(e.batching, '$.strategy')",
    "throughput": _first("median_tok_s", "median_steps_s"),
    # an older summary has no "best": its min_loss is the same number
    "best:loss": _first("best.loss", "min_loss"),
    "last:loss": _summary("loss"),
    "best:eval_loss": _first(*(f"best.{k}" for k in EVAL_LOSS)),
    "last:eval_loss": _first(*EVAL_LOSS),
    "started": "e.started",
    "duration": "COALESCE(e.ended, CAST(strftime('%s', 'now') AS REAL)) - e.started",
}


def page(reg: Registry, *, offset: int = 0, limit: int = 100, sort: str = "id", desc: bool = True,
         filters: dict[str, str] | None = None) -> dict[str, Any]:
    """``{"rows": [...], "total": N}``: the ``limit`` rows from ``offset`` of the experiments that match
    ``filters`` (state, target or CT, sweep, message: parts of the value, any case), by the column ``sort``."""
    if sort not in COLUMNS:
        raise ValueError(f"no column {sort!r} to sort on (one of {', '.join(COLUMNS)})")
    where, args = _where(filters or {})
    # rows without a value sort last either way; the id breaks ties, so the order never changes between loads
    order = f"({COLUMNS[sort]}) IS NULL, {COLUMNS[sort]} {'DESC' if desc else 'ASC'}, e.id {'DESC' if desc else 'ASC'}"
    join = "LEFT JOIN metrics m ON m.experiment = e.id"
    total = reg._exec(f"SELECT count(*) FROM experiments e {join} {where}", args, fetch="one")[0]
    picks = ", ".join(f"{expr} AS \"{name}\"" for name, expr in COLUMNS.items()
                      if name not in ("id", "state", "message", "target", "batching", "started"))
    rows = reg._exec(
        "SELECT e.id, e.status, e.message, e.target, json_extract(e.target_info, '$.ct') AS ct, e.gpus, "
        "json_extract(e.batching, '$.strategy') AS strategy, e.sweep, e.created, e.started, e.ended, "
        f"{_summary('median_tok_s')} AS tok_s, {_summary('median_steps_s')} AS steps_s, "
        f"{_summary('eval_metric')} AS eval_metric, {picks} "
        f"FROM experiments e {join} {where} ORDER BY {order} LIMIT ? OFFSET ?",
        [*args, int(limit), int(offset)], fetch="all")
    out = []
    for r in rows:
        throughput = ({"value": r["tok_s"], "unit": "tok/s"} if r["tok_s"] is not None else
                      {"value": r["steps_s"], "unit": "steps/s"} if r["steps_s"] is not None else None)
        orphaned = r["status"] == "launching" and not launcher_alive(reg.path.parent, r["id"])
        out.append({"id": r["id"], "state": "orphaned" if orphaned else r["status"], "message": r["message"],
                    "target": r["target"], "ct": r["ct"],
                    "gpus": [g.get("index") for g in (json.loads(r["gpus"]) if r["gpus"] else None) or []],
                    "strategy": r["strategy"], "sweep": r["sweep"], "throughput": throughput,
                    "eval_metric": r["eval_metric"],
                    "values": {k: r[k] for k in ("best:loss", "last:loss", "best:eval_loss", "last:eval_loss")},
                    "started": r["started"], "ended": r["ended"], "created": r["created"]})
    return {"rows": out, "total": total}


def _where(filters: dict[str, str]) -> tuple[str, list[Any]]:
    parts, args = [], []
    state = (filters.get("state") or "").strip()
    if state:
        parts.append("e.status = ?")
        args.append(state)
    target = (filters.get("target") or "").strip()
    if target:
        parts.append("(instr(e.target, ?) > 0 OR CAST(json_extract(e.target_info, '$.ct') AS TEXT) = ?)")
        args += [target, target]
    for key, column in (("sweep", "e.sweep"), ("message", "e.message")):
        value = (filters.get(key) or "").strip()
        if value:
            parts.append(f"instr(lower(COALESCE({column}, '')), ?) > 0")
            args.append(value.lower())
    return ("WHERE " + " AND ".join(parts)) if parts else "", args
