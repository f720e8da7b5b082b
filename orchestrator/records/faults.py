"""What the registry's file system and neighbours say when the registry cannot be used: who holds its lock,
how much room is left. Plain file and /proc reads, no SQLite: ``experiments.py`` turns these into errors.

    holder(Path(".orch/experiments.db"))   # (4242, "orch deploy"), or None
    space(Path(".orch/experiments.db"))    # "0 bytes free on /proj/.orch"
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

LOW_SPACE = 1 << 20  # bytes: below this a failed write is taken for a full disk


def _ids(path: Path) -> set[tuple[int, int, int]]:
    """(major, minor, inode) of the registry file and of the files SQLite locks beside it."""
    out = set()
    for p in (path, Path(f"{path}-shm"), Path(f"{path}-wal")):
        try:
            st = p.stat()
        except OSError:
            continue
        out.add((os.major(st.st_dev), os.minor(st.st_dev), st.st_ino))
    return out


def _command(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return ""
    words = [a.decode(errors="replace") for a in argv if a]
    if len(words) > 2 and words[1:3] == ["-m", "orchestrator.cli.main"]:
        words = ["orch", *words[3:]]
    elif words and Path(words[0]).name.startswith("python") and len(words) > 1 and Path(words[1]).name == "orch":
        words = words[1:]
    if words:
        words[0] = Path(words[0]).name
    return " ".join(" ".join(words).split())[:80]


def holder(path: Path) -> tuple[int, str] | None:
    """The process holding a write lock on the registry (from ``/proc/locks``): its pid and command line."""
    ids = _ids(path)
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if "->" in fields or len(fields) < 8 or fields[3] != "WRITE":
            continue  # a waiter, or a shared (reader's) lock
        try:
            pid = int(fields[4])
            major, minor, inode = fields[5].split(":")
            key = (int(major, 16), int(minor, 16), int(inode))
        except ValueError:
            continue
        if key in ids and pid not in (os.getpid(), -1):
            return pid, _command(pid)
    return None


def free_bytes(path: Path) -> int | None:
    try:
        return shutil.disk_usage(path.parent).free
    except OSError:
        return None


def full(path: Path) -> bool:
    """Whether the registry's file system is (nearly) out of room."""
    free = free_bytes(path)
    return free is not None and free < LOW_SPACE


def space(path: Path) -> str:
    free = free_bytes(path)
    return f"{free if free is not None else 'unknown'} bytes free on {path.parent}"
