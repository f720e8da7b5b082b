"""Reading a run's log by byte offset, so a follower can resume exactly where it was."""

from __future__ import annotations

import base64
import os

from .layout import Layout
from .protocol import AgentFailure
from .runs import LOG, run_state


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


def read(layout: Layout, exp_id: int, offset: int | None = None, tail_lines: int | None = None,
         max_bytes: int = 1 << 20, identity: str | None = None, registry: str | None = None) -> dict:
    """Bytes from ``offset`` (or the last ``tail_lines`` lines), plus what the follower needs to resume.

    ``identity`` is the log's (device, inode) from the previous read: if it changed, or the file is
    now shorter than ``offset``, the log was rotated or truncated and reading starts over (``reset``).
    """
    run_dir = layout.run_dir(exp_id, registry)
    if not os.path.isdir(run_dir):
        raise AgentFailure("notfound", f"experiment {exp_id} has no run folder on this target",
                           "check the experiment id and target (orch experiments list)")
    path = os.path.join(run_dir, LOG)
    state = run_state(run_dir)
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
        fh.seek(offset)
        data = fh.read(max(0, min(int(max_bytes), size - offset)))
    return {"data": base64.b64encode(data).decode(), "offset": offset + len(data), "size": size,
            "identity": ident, "reset": reset, "state": state}
