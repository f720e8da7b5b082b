"""Whether a ``launching`` experiment still has a live orch process behind it: one flock per launch.

The process that creates an experiment row holds an exclusive lock on ``.orch/launching/<id>.lock``
from before the row is committed until its launch is recorded. The kernel drops the lock however that
process ends (SIGKILL, an OOM kill, a closed terminal), so a ``launching`` row whose lock is free was
orphaned: the next command that reaches its target asks what the target did (``status.recover``).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

FOLDER = "launching"


def _path(state_dir: Path, exp_id: int) -> Path:
    return state_dir / FOLDER / f"{int(exp_id)}.lock"


class LaunchGuard:
    """Held by the launching process; ``hold`` is called by ``Registry.create`` before the row commits."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.fd: int | None = None
        self.exp_id: int | None = None

    def hold(self, exp_id: int) -> None:
        path = _path(self.state_dir, exp_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)  # a new id: at most a checker holds it, for a moment
        self.fd, self.exp_id = fd, exp_id

    def release(self) -> None:
        """After the row's state is final (or known): the lock file goes, then the lock."""
        if self.fd is None:
            return
        forget(self.state_dir, self.exp_id or 0)
        os.close(self.fd)
        self.fd = None


def launcher_alive(state_dir: Path, exp_id: int) -> bool:
    """True while the process that created experiment ``exp_id`` is still launching it."""
    try:
        fd = os.open(_path(state_dir, exp_id), os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the lock this check may have taken
    return False


def forget(state_dir: Path, exp_id: int) -> None:
    try:
        os.unlink(_path(state_dir, exp_id))
    except FileNotFoundError:
        pass
