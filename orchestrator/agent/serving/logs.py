"""Reading a run's log by byte offset, so a follower can resume exactly where it was."""

from __future__ import annotations

import base64
import os
import sys
import time
from typing import Callable

from ..layout import Layout, read_json
from ..protocol import AgentFailure, data_frame
from ..run import series, slurm
from ..run.runs import LOG, run_state


def _tail_offset(fh, size: int, lines: int) -> int:
    """The offset where the last ``lines`` complete lines start."""
    if lines <= 0:
        return size
    pos, block, seen = size, 65536, 0
    while pos > 0:
        step = min(block, pos)
        pos -= step
        fh.seek(pos)
        chunk = fh.read(step)
        end = len(chunk)
        if pos + end == size and chunk.endswith(b"\n"):
            end -= 1  # the final newline closes the last line, it does not start one
        while True:
            i = chunk.rfind(b"\n", 0, end)
            if i < 0:
                break
            seen += 1
            if seen == lines:
                return pos + i + 1
            end = i
    return 0


def _node(run_dir: str, node: int | None) -> tuple[str, Callable[[], dict]]:
    """The folder whose log is read and how its run's state is told: the run folder's own, or, for ``node`` N > 0
    of a Slurm job over several nodes, ``nodes/<N>/`` (each node's supervisor writes its own log there)."""
    if not node:
        return run_dir, lambda: run_state(run_dir)
    if slurm.job_of(run_dir) is None:
        raise AgentFailure("input", f"node {node}: this run is not a Slurm job over several nodes",
                           "leave out the node (a job over several CTs names each of them)")
    folder = os.path.join(run_dir, "nodes", str(int(node)))
    return folder, lambda: node_state(run_dir, folder)


def node_state(run_dir: str, folder: str) -> dict:
    """A Slurm job's node N > 0: the job's state (its first node's record), except that a node whose supervisor
    still writes (no exit record of its own while Slurm still runs the job) reads as running: a follower of its
    log waits for its last lines even when the first node ended before it."""
    state = run_state(run_dir)
    if state.get("state") not in ("finished", "crashed", "stopped", "lost", "failed"):
        return state
    if isinstance(read_json(os.path.join(folder, "exit.json")), dict):
        return state
    job = slurm.job_of(run_dir) or {}
    listed = slurm.queue([job["job_id"]]).get(job["job_id"]) if job.get("job_id") else None
    return dict(state, state="running") if listed and listed["state"] in slurm.RUNNING else state


def read(layout: Layout, exp_id: int, offset: int | None = None, tail_lines: int | None = None,
         max_bytes: int = 1 << 20, identity: str | None = None, registry: str | None = None,
         series_offset: int | None = None, node: int | None = None) -> dict:
    """Bytes from ``offset`` (or the last ``tail_lines`` lines), plus what the follower needs to resume.

    ``identity`` is the log's (device, inode) from the previous read: if it changed, or the file is
    now shorter than ``offset``, the log was rotated or truncated and reading starts over (``reset``).
    With ``series_offset``, where the run's supervisor keeps its metric series (``series.py``) with a record in
    it, the answer is the series' records from there (``series``) in place of the log's bytes. ``node``: that node's
    log of a Slurm job over several nodes (``_node``).
    """
    run_dir = layout.run_dir(exp_id, registry)
    if not os.path.isdir(run_dir):
        raise AgentFailure("notfound", f"experiment {exp_id} has no run folder on this target",
                           "check the experiment id and target (orch experiments list)")
    run_dir, told = _node(run_dir, node)
    path = os.path.join(run_dir, LOG)
    state = told()
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return {"data": "", "offset": 0, "size": 0, "identity": None, "reset": False, "state": state}
    with fh:
        st = os.fstat(fh.fileno())
        ident = f"{st.st_dev}:{st.st_ino}"
        size = st.st_size
        reset = False
        if tail_lines is not None:
            offset = _tail_offset(fh, size, int(tail_lines))
        elif offset is None:
            offset = 0
        elif (identity and identity != ident) or offset > size:
            offset, reset = 0, True
        # (with tail_lines: the series' records of those last lines, a reader's context before them)
        kept = (series.answer(run_dir, series_offset, max_bytes, offset if tail_lines is not None else None)
                if series_offset is not None else None)
        if kept is not None:
            return {"data": "", "offset": offset, "size": size, "identity": ident, "reset": reset, "state": state,
                    "series": kept}
        fh.seek(offset)
        data = fh.read(max(0, min(int(max_bytes), size - offset)))
    return {"data": base64.b64encode(data).decode(), "offset": offset + len(data), "size": size,
            "identity": ident, "reset": reset, "state": state}


OVERLAP = 16  # bytes before the offset re-read on every growth: a log truncated and regrown is caught


def _frame(data: bytes, offset: int, size: int, identity: str) -> bytes:
    return data_frame({"offset": offset, "size": size, "identity": identity}, data)


def stream(layout: Layout, exp_id: int, offset: int, identity: str, seen: str = "", registry: str | None = None,
           max_bytes: int = 1 << 20, poll: float = 0.05, heartbeat: float = 2.0, node: int | None = None) -> dict:
    """Write what is appended to the log after ``offset`` as frames, as it is written, until the run has
    ended and every byte is out; then answer where it stopped.

    It only ever continues the log the follower already has (same ``identity``, and the ``seen`` bytes
    just before ``offset`` unchanged); anything else (rotation, truncation, the file gone) ends the
    stream with ``why`` and the follower's ordinary read sorts it out. An empty frame every
    ``heartbeat`` seconds shows the link is alive and notices a controller that went away.
    """
    out = sys.stdout.buffer  # frames go out between the request and the envelope
    poll = max(poll, 0.005)
    run_dir = layout.run_dir(exp_id, registry)
    if not os.path.isdir(run_dir):
        raise AgentFailure("notfound", f"experiment {exp_id} has no run folder on this target",
                           "check the experiment id and target (orch experiments list)")
    run_dir, told = _node(run_dir, node)
    path = os.path.join(run_dir, LOG)
    tail = base64.b64decode(seen)[-OVERLAP:]
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return {"why": "missing", "offset": offset}
    sent_at = time.monotonic()
    ended = False
    with fh:
        while True:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                return {"why": "missing", "offset": offset}
            if f"{st.st_dev}:{st.st_ino}" != identity or st.st_size < offset:
                return {"why": "changed", "offset": offset}
            if st.st_size > offset:
                if tail:
                    fh.seek(offset - len(tail))
                    if fh.read(len(tail)) != tail:
                        return {"why": "changed", "offset": offset}
                fh.seek(offset)
                data = fh.read(min(max_bytes, st.st_size - offset))
                offset += len(data)
                tail = (tail + data)[-OVERLAP:]
                out.write(_frame(data, offset, st.st_size, identity))
                out.flush()
                sent_at = time.monotonic()
                continue
            if ended:  # the run had ended and a look after that found nothing more: all is out
                return {"why": "ended", "offset": offset}
            ended = told()["state"] not in ("running", "launching")
            if ended:
                continue  # one more look: the last bytes may have landed after the previous one
            if time.monotonic() - sent_at >= heartbeat:
                out.write(_frame(b"", offset, st.st_size, identity))  # a controller gone: BrokenPipeError
                out.flush()
                sent_at = time.monotonic()
            time.sleep(poll)
