"""A full disk on the target: one clear line that names the path, the free space and the remedy, and the
cleaning of orch's own stale temporary files (left by a crash or a full disk) on the next locked call."""

from __future__ import annotations

import errno
import os
import shutil
import time

from .layout import make_writable
from .protocol import AgentFailure

FULL = (errno.ENOSPC, errno.EDQUOT)
REMEDY = ("free space on the target: orch checkpoints list, then orch checkpoints purge <entry> --yes "
          "(or delete files you no longer need)")
WHAT = {"blobs_store": "storing the pushed files", "revision_assemble": "assembling the revision",
        "run_start": "starting the run", "run_stop": "stopping the run",
        "ckpt_trash": "moving checkpoints to the trash", "ckpt_restore": "restoring checkpoints"}
STALE_AFTER = 3600.0  # an hour: no orch write keeps a temporary file open that long


def is_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in FULL


def _free(path: str) -> str:
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        st = os.statvfs(path or "/")
    except OSError:
        return "unknown"
    free = st.f_bavail * st.f_frsize
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if free < 1024 or unit == "TB":
            return f"{free:.0f} {unit}" if unit == "B" else f"{free:.1f} {unit}"
        free /= 1024
    return "unknown"


def full_failure(exc: OSError, what: str, fallback: str) -> AgentFailure:
    """``exc`` (ENOSPC/EDQUOT) as the user should read it."""
    path = exc.filename if isinstance(exc.filename, str) else fallback
    why = "quota exceeded" if exc.errno == errno.EDQUOT else "no space left on the device"
    return AgentFailure("agent", f"{WHAT.get(what, what)}: {why} writing {path} ({_free(path)} free)", REMEDY)


def is_orch_tmp(name: str) -> bool:
    return name.startswith(".tmp-")


def clean_stale(folders: list[str], now: float | None = None) -> list[str]:
    """Remove ``.tmp-*`` files and folders older than an hour in ``folders`` and one level below
    (a run folder's atomic writes); best effort, never a reason to fail the call. The paths removed."""
    now = time.time() if now is None else now
    removed = []
    for folder in folders:
        for parent in [folder] + _subfolders(folder):
            try:
                names = os.listdir(parent)
            except OSError:
                continue
            for name in names:
                if is_orch_tmp(name) and _remove_if_old(os.path.join(parent, name), now):
                    removed.append(os.path.join(parent, name))
    return removed


def _subfolders(folder: str) -> list[str]:
    try:
        return [e.path for e in os.scandir(folder) if e.is_dir(follow_symlinks=False) and not is_orch_tmp(e.name)]
    except OSError:
        return []


def _remove_if_old(path: str, now: float) -> bool:
    try:
        st = os.lstat(path)
        if now - st.st_mtime < STALE_AFTER:
            return False
        if os.path.isdir(path) and not os.path.islink(path):
            make_writable(path)  # a revision cut between its sealing and its rename is read-only
            shutil.rmtree(path)
        else:
            os.unlink(path)
        return True
    except OSError:
        return False


class SparedLog:
    """The supervisor's handle on a run's log: a line it cannot write on a full disk is skipped, and the run goes on
    (the command writes through ``fileno`` itself)."""

    def __init__(self, fh) -> None:
        self.fh = fh

    def write(self, data: bytes) -> int:
        try:
            return self.fh.write(data)
        except OSError as exc:
            if exc.errno not in FULL:
                raise
            return 0

    def fileno(self) -> int:
        return self.fh.fileno()
