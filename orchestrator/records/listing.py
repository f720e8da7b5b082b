"""``orch experiments list``: the newest experiments in one query, however long the project's history.

The table reads only the columns it shows (the batching strategy picked out by SQLite, no record decoded); the
``--json`` records are built from their rows as ``Experiment.public`` would give them, without a model per row
and without reading the revision's file list (SQLite counts it) or the git diff:

    with Registry(path) as reg:
        shown, total = rows(reg, limit=50)          # the table
        records, total = public_records(reg, limit=50)  # --json
"""

from __future__ import annotations

import json
from typing import Any

from .experiments import _JSON_FIELDS, Registry
from .launch_guard import launcher_alive

# what the table shows, each an SQL expression over the experiment row
_SHOWN = ("id, status, exit_code, target, revision, json_extract(batching, '$.strategy') AS strategy, sweep, parent, "
          "created, message, error")
# every column of the record but the two ``Experiment.public`` leaves out (the file list, counted instead, and the
# git diff)
_PUBLIC = ("id, project, message, created, started, ended, target, target_info, machine, revision, "
           "json_array_length(revision_files) AS files, git_commit, git_dirty, command, config, batching, "
           "batching_plan, parent, checkpoints, checkpoints_action, checkpoints_entry, status, exit_code, error, "
           "attempts, nodes, end_reason, gpus, gpu_series, env, sweep")
_FLOATS = ("created", "started", "ended")  # REAL columns a model would give as floats


def _where(target: str | None) -> tuple[str, list[Any]]:
    return (" WHERE target = ?", [target]) if target else ("", [])


def count(reg: Registry, target: str | None = None) -> int:
    """How many experiments the listing has in all (of ``target``, if given)."""
    where, args = _where(target)
    return reg._exec(f"SELECT count(*) FROM experiments{where}", args, fetch="one")[0]


def _newest(reg: Registry, columns: str, target: str | None, limit: int) -> list:
    """The newest ``limit`` experiments' ``columns`` (of ``target`` alone, if named), newest first."""
    where, args = _where(target)
    return reg._exec(f"SELECT {columns} FROM experiments{where} ORDER BY id DESC LIMIT ?", [*args, int(limit)],
                     fetch="all")


def rows(reg: Registry, target: str | None = None, limit: int = 50) -> tuple[list[dict], int]:
    """The table's rows, newest first (``orphaned`` marked: a launch whose process is gone), and the total."""
    out = []
    for r in _newest(reg, _SHOWN, target, limit):
        row = dict(r)
        row["orphaned"] = row["status"] == "launching" and not launcher_alive(reg.path.parent, row["id"])
        out.append(row)
    return out, _total(reg, target, len(out), limit)


def public_records(reg: Registry, target: str | None = None, limit: int = 50) -> tuple[list[dict], int]:
    """``orch experiments list --json``'s records, newest first, as ``listing`` gives them, and the total."""
    out = []
    for r in _newest(reg, _PUBLIC, target, limit):
        rec = dict(r)
        for k in (*_JSON_FIELDS, "command"):
            if rec.get(k) is not None:
                rec[k] = json.loads(rec[k])
        for k in _FLOATS:
            if rec[k] is not None:
                rec[k] = float(rec[k])
        if rec["git_dirty"] is not None:
            rec["git_dirty"] = bool(rec["git_dirty"])
        rec["files"] = rec["files"] or 0
        rec["secrets"] = list((rec["config"].get("project") or {}).get("secrets") or [])
        rec["orphaned"] = rec["status"] == "launching" and not launcher_alive(reg.path.parent, rec["id"])
        out.append(rec)
    return out, _total(reg, target, len(out), limit)


def _total(reg: Registry, target: str | None, shown: int, limit: int) -> int:
    """The count, asked only when the page is full (a short page is everything there is)."""
    return shown if shown < limit else count(reg, target)
