"""The journal of a locked launch: what each of its steps did, written in the new run's folder as it goes.

A controller cut off, SIGKILLed or crashed mid-launch never hears the answer of its agent call; the
agent finishes anyway. So the agent appends one JSON line per step to ``runs/<key>/journal.jsonl`` and
fsyncs it before the next step starts, and any later command, from any clone, reads the truth there::

    {"event": "begin", "what": "restart", "exp_id": 2, "project": "tinylm", "ops": ["run_check", ...], "t": ...}
    {"event": "done", "op": "run_stop", "value": {"stopped": [{"id": 1, "exit_code": 130, ...}]}, "t": ...}
    {"event": "done", "op": "ckpt_trash", "value": {"action": "moved", "entry_path": "...", ...}, "t": ...}
    {"event": "failed", "op": "run_start", "error": {"kind": "agent", "message": "..."}, "t": ...}
    {"event": "end", "t": ...}

A step that changes nothing its reader acts on (``UNCHANGING``: a check, the blobs stored, a revision assembled, the
start verified) is appended without an fsync of its own: the next line that is fsynced (a stop, a checkpoint move,
a start, a failure) makes it durable too, and a crash that loses it loses no change. Nor is the end fsynced: no
reader decides anything by it (a launch whose start line is there started, whatever follows).

Writing is best effort (a full disk must not fail the launch it records): after the first failed write
the journal stays silent. ``read`` takes what is whole: a last line cut by a crash is left out.
"""

from __future__ import annotations

import json
import os
import time

from .layout import Layout, fsync_dir

FILE = "journal.jsonl"
WORK = "work"  # a run's work folder (workdir.py)
MAX_LINE = 64 << 10  # a step's value beyond this is recorded as truncated: the journal stays small
# the ops whose done-line needs no fsync of its own: nothing they did is read back from the journal
# (``records/launch_journal.facts`` reads the stops, the checkpoints' moves, the start, a failure and the end)
UNCHANGING = frozenset({"blobs_store", "revision_assemble", "run_check", "slurm_check", "run_verify"})


def path_in(run_dir: str) -> str:
    return os.path.join(run_dir, FILE)


def only_launch(run_dir: str) -> bool:
    """Whether ``run_dir`` holds nothing but a launch's journal (and the work folder a shell step of that launch
    made before the start): the folder this launch made, free for its run."""
    try:
        names = set(os.listdir(run_dir))
    except OSError:
        return False
    return FILE in names and names <= {FILE, WORK}


class Journal:
    """Appends a locked launch's steps to its run folder's journal; silent once a write fails."""

    def __init__(self, run_dir: str) -> None:
        self.path = path_in(run_dir)
        self.ok = True

    def begin(self, what: str, ops: list[str], **facts: object) -> None:
        run_dir = os.path.dirname(self.path)
        try:
            os.makedirs(os.path.dirname(run_dir), exist_ok=True)
            try:
                os.mkdir(run_dir)
            except FileExistsError:
                if not only_launch(run_dir):
                    self.ok = False  # not ours: the start check says so, and nothing is written into it
                    return
            self._append({"event": "begin", "what": what, "ops": ops, "pid": os.getpid(), **facts})
            fsync_dir(os.path.dirname(run_dir))
        except OSError:
            self.ok = False

    def step(self, op: str, result: dict) -> None:
        if result.get("ok"):
            self._append({"event": "done", "op": op, "value": result.get("value")}, sync=op not in UNCHANGING)
        else:
            error = {k: v for k, v in (result.get("error") or {}).items() if k != "traceback"}
            self._append({"event": "failed", "op": op, "error": error})

    def end(self) -> None:
        self._append({"event": "end"}, sync=False)  # read by no decision: the answer does not wait for the disk

    def _append(self, entry: dict, sync: bool = True) -> None:
        if not self.ok:
            return
        line = json.dumps({**entry, "t": time.time()}, separators=(",", ":"), default=str)
        if len(line) > MAX_LINE:
            line = json.dumps({**{k: v for k, v in entry.items() if k != "value"}, "value": {"truncated": True},
                               "t": time.time()}, separators=(",", ":"))
        try:
            append_line(self.path, line, sync)
        except OSError:
            self.ok = False


def append_line(path: str, line: str, sync: bool = True) -> None:
    """One JSON line appended and (``sync``) fsynced before the caller's next step (this journal's, and a guard's)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_lines(path: str, limit: int = 16 << 20) -> list[dict]:
    """A JSON-lines file's whole entries, oldest first; [] when there is none. A line cut short or not JSON is
    skipped: the last line of a crashed write, or damage; what is whole still tells."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit)
    except OSError:
        return []
    entries = []
    for raw in data.split(b"\n"):
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if isinstance(entry, dict):
            entries.append(entry)
    return entries


def read(run_dir: str) -> list[dict]:
    """The journal's whole entries, oldest first; [] when there is none."""
    return [e for e in read_lines(path_in(run_dir)) if isinstance(e.get("event"), str)]


def read_many(layout: Layout, ids: list, registry: str | None = None) -> dict:
    """``journal_read``: experiment number (as a string) -> its journal's entries, for the numbers that have one;
    a launch still running its steps (its agent holds the target's lock now) ends with ``{"event": "underway"}``."""
    out = {}
    for exp_id in ids:
        entries = read(layout.run_dir(int(exp_id), registry))
        if entries:
            begin = next((e for e in entries if e["event"] == "begin"), {})
            if not any(e["event"] == "end" for e in entries) and _holds_lock(layout, begin.get("pid")):
                entries.append({"event": "underway", "t": time.time()})
            out[str(int(exp_id))] = entries
    return out


def _holds_lock(layout: Layout, pid: object) -> bool:
    """Whether process ``pid`` holds the target's lock now (the lock file names its holder while it is held)."""
    import fcntl

    try:
        with open(layout.lock, "rb") as fh:
            holder = json.loads(fh.read() or b"{}").get("pid")
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return isinstance(pid, int) and holder == pid  # held, by that launch's agent
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
            return False  # nobody holds it: a journal without its end was cut (its agent killed)
    except (OSError, ValueError, AttributeError):
        return False
