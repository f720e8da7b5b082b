"""Who wrote each checkpoint file: the run of the folder that was running when the file was last written.

The target keeps every run's record (``runs/<registry>-<id>/``: its checkpoint folder, when it started and when it
ended), and a file's mtime says when it was last written; the rename into a trash entry keeps it. Of the runs that
used the folder, the one running at that moment wrote it (a lineage's runs follow one another: a launch stops the
old run before it starts the new one)::

    runs = folder_runs(layout, "/w/checkpoints/tinylm")
    who = writer_of(os.lstat(path).st_mtime, runs)   # {"id": 4, "registry": "ab12cd34", ...} or None
    said = written_by(who, registry="ab12cd34")      # "written by experiment 4"
"""

from __future__ import annotations

import os

from ..layout import Layout, parse_run_key, read_json
from ..run.runs import run_state

SLACK = 2.0  # s: a file stamped a moment before its run's start was recorded, or after its end


def folder_runs(layout: Layout, norm: str) -> list[dict]:
    """The runs whose record names ``norm`` as their checkpoint folder: ``id``, ``registry``, ``clone``,
    ``started`` and ``ended`` (None: still running) each; those that never started are left out."""
    try:
        names = os.listdir(layout.runs)
    except OSError:
        return []
    out = []
    for name in names:
        if parse_run_key(name) is None:
            continue
        run_dir = os.path.join(layout.runs, name)
        exp = read_json(os.path.join(run_dir, "experiment.json"), {}) or {}
        ckpt = exp.get("checkpoints") if isinstance(exp, dict) else None
        if not isinstance(ckpt, str) or os.path.normpath(ckpt) != norm:
            continue
        state = run_state(run_dir)
        if isinstance(state.get("started"), (int, float)):
            out.append({k: state.get(k) for k in ("id", "registry", "clone", "started", "ended")})
    return out


def writer_of(mtime: float, runs: list[dict]) -> dict | None:
    """The run that was running at ``mtime`` (within ``SLACK`` when none strictly was); of several, the one
    started last."""
    def during(run: dict, slack: float) -> bool:
        ended = run["ended"] if isinstance(run.get("ended"), (int, float)) else float("inf")
        return run["started"] - slack <= mtime <= ended + slack

    found = [r for r in runs if during(r, 0.0)] or [r for r in runs if during(r, SLACK)]
    return max(found, key=lambda r: (r["started"], r["id"] or 0)) if found else None


def is_run(run: dict | None, exp_id: int, registry: str | None) -> bool:
    """Whether ``run`` is experiment ``exp_id`` of ``registry`` (a run folder from before registry keys is any's)."""
    return run is not None and run.get("id") == exp_id and (run.get("registry") in (None, registry)
                                                             or registry is None)


def written_by(run: dict, registry: str | None) -> str:
    """How a pull names the writer of a file that is not the pulled run's."""
    if run.get("registry") not in (None, registry) and registry is not None:
        clone = run.get("clone") or {}
        where = f" ({clone.get('host', '?')}, {clone.get('path', '?')})" if clone else ""
        return f"written by experiment {run['id']} of another clone of this project{where}"
    return f"written by experiment {run['id']}"
