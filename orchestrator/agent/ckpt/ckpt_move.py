"""``ckpt_move``: an older orch's variant folders, nested in the lineage's folder, moved to their own place.

An older orch gave each sweep variant and ``--beside`` run ``F/exp<N>``, inside the lineage's folder ``F``.
The next launch (in its locked call, after the runs it replaces stopped) moves each one whose runs are over to
where ``ckpt_layout`` places it now, nothing copied and nothing deleted. Each step is appended to
``<root>/checkpoint-moves.jsonl`` (fsynced) before the next starts, and a step done again is a no-op, so a
move cut short (the agent killed, the container restarted) is finished by the next launch::

    {"event": "begin", "id": "…", "from": "F/exp29", "to": "F@exp29"}
    {"event": "done", "id": "…", "step": "folder"}    F/exp29 -> F@exp29 (a rename, never across filesystems)
    {"event": "done", "id": "…", "step": "trash"}     F/exp29.trash -> F@exp29.trash, when there is one
    {"event": "done", "id": "…", "step": "records"}   the run records naming F/exp29 name F@exp29
    {"event": "end", "id": "…"}

A folder whose run still runs or waits in the queue stays until a later launch (every reader of ``F`` passes
over it meanwhile); one whose new place is taken is left where it is, and said.
"""

from __future__ import annotations

import json
import os
import time

from .. import journal
from . import ckpt_layout
from .checkpoints import check_path
from ..layout import Layout, parse_run_key, read_json, write_json
from ..protocol import AgentFailure
from ..run.runs import run_state

JOURNAL = "checkpoint-moves.jsonl"
STEPS = ("folder", "trash", "records")


def _log(path: str, entry: dict) -> None:
    journal.append_line(path, json.dumps({**entry, "t": time.time()}, separators=(",", ":")))


def _rename(src: str, dst: str) -> None:
    """``src`` to ``dst`` unless that was done already; refused when both exist (nothing is merged)."""
    if not os.path.lexists(src):
        return
    if os.path.lexists(dst):
        raise FileExistsError(f"{dst} exists already")
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    os.rename(src, dst)


def _rewrite(path: str, change) -> None:
    """A record rewritten in place, its mtime kept (a run folder's ``experiment.json`` orders the runs)."""
    data = read_json(path)
    if not isinstance(data, dict):
        return
    new = change(dict(data))
    if new == data:
        return
    st = os.stat(path)
    write_json(path, new)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _records(layout: Layout, src: str, dst: str) -> list[str]:
    """Every run record naming ``src`` as its checkpoint folder names ``dst``; the run folders changed."""
    changed = []
    try:
        names = sorted(os.listdir(layout.runs))
    except OSError:
        return changed
    for name in names:
        run_dir = os.path.join(layout.runs, name)
        exp = read_json(os.path.join(run_dir, "experiment.json"), {}) or {}
        if not isinstance(exp, dict) or os.path.normpath(str(exp.get("checkpoints") or "/")) != src:
            continue
        _rewrite(os.path.join(run_dir, "launch.json"), lambda d: {**d, "env": {
            **(d.get("env") or {}), **({"ORCH_CHECKPOINT_DIR": dst}
                                       if (d.get("env") or {}).get("ORCH_CHECKPOINT_DIR") == src else {})}})
        _rewrite(os.path.join(run_dir, "experiment.json"), lambda d: {**d, "checkpoints": dst})
        changed.append(name)
    return changed


def _finish(layout: Layout, log: str, begin: dict, done: set) -> list[str]:
    """The steps of one move not done yet; the run folders whose records it changed."""
    src, dst = begin["from"], begin["to"]
    runs: list[str] = []
    for step in STEPS:
        if step in done:
            continue
        if step == "folder":
            _rename(src, dst)
        elif step == "trash":
            _rename(src + ".trash", dst + ".trash")
        else:
            runs = _records(layout, src, dst)
        _log(log, {"event": "done", "id": begin["id"], "step": step})
    _log(log, {"event": "end", "id": begin["id"]})
    return runs


def _moved(runs: list[str], src: str, dst: str) -> list[dict]:
    out = []
    for name in runs:
        key = parse_run_key(name)
        if key is not None:
            out.append({"exp_id": key[1], "registry": key[0], "from": src, "to": dst})
    return out


def move(layout: Layout, path: str, configured: str) -> dict:
    """Finish the moves a cut left, then move every nested variant folder of ``path`` whose runs are over.
    ``moved``: the runs whose folder moved (their records on the target say so now); ``left``: what stays, why."""
    try:
        norm = check_path(layout, path, configured, busy_check=False)
    except AgentFailure as exc:  # a launch past its stop still starts its run: this only tidies the layout
        return {"moved": [], "left": [], "skipped": exc.message}
    log = os.path.join(layout.root, JOURNAL)
    entries = journal.read_lines(log)
    moved: list[dict] = []
    left: list[dict] = []
    ended = {e.get("id") for e in entries if e.get("event") in ("end", "failed")}
    for begin in [e for e in entries if e.get("event") == "begin" and e.get("id") not in ended]:
        if os.path.dirname(str(begin.get("from"))) != norm:
            continue  # another project's folder: its own launch finishes it
        done = {e.get("step") for e in entries if e.get("id") == begin["id"] and e.get("event") == "done"}
        moved += _attempt(layout, log, begin, done, left)
    for name, users in sorted(ckpt_layout.legacy(layout, norm).items()):
        if name.endswith(".trash"):
            continue  # moved with its folder
        busy = next((u for u in users if u["queued"] or (u["run_dir"] and run_state(u["run_dir"])["state"]
                                                         in ("running", "launching"))), None)
        src = os.path.join(norm, name)
        if busy is not None:
            left.append({"from": src, "why": "queued" if busy["queued"] else "running"})
            continue
        begin = {"event": "begin", "id": f"{time.time_ns()}-{name}", "from": src,
                 "to": ckpt_layout.variant(norm, int(name[3:]))}
        _log(log, begin)
        moved += _attempt(layout, log, begin, set(), left)
    return {"moved": moved, "left": left}


def _attempt(layout: Layout, log: str, begin: dict, done: set, left: list) -> list[dict]:
    try:
        return _moved(_finish(layout, log, begin, done), begin["from"], begin["to"])
    except OSError as exc:  # nothing lost: what was not renamed is where it was
        _log(log, {"event": "failed", "id": begin["id"], "error": str(exc)[:300]})
        left.append({"from": begin["from"], "why": str(exc)[:300]})
        return []
