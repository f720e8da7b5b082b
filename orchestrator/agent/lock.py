"""One lock per target root, so two operations never interleave their changes."""

from __future__ import annotations

import fcntl
import json
import os
import time

from . import diskspace
from .protocol import AgentFailure


class TargetLock:
    """An exclusive ``flock`` on ``root/.lock``, held for the life of one agent call.

    The kernel releases it if the agent dies, so a crashed operation never leaves the target locked.
    """

    def __init__(self, path: str, wait: float, what: str, cancelled=lambda: False) -> None:
        self.path, self.wait, self.what, self.cancelled = path, wait, what, cancelled
        self.fd: int | None = None

    def __enter__(self) -> "TargetLock":
        try:  # creating the file may need space; an existing one never does
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            if diskspace.is_full(exc):
                raise diskspace.full_failure(exc, "taking the target's lock", self.path) from None
            raise
        deadline = time.monotonic() + self.wait
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if self.cancelled():  # nobody waits for this operation any more: do not start it later
                    os.close(self.fd)
                    self.fd = None
                    raise AgentFailure("cancelled", "the controller went away while waiting for the lock")
                if time.monotonic() >= deadline:
                    holder = self._holder()
                    os.close(self.fd)
                    self.fd = None
                    raise AgentFailure(
                        "conflict",
                        f"the target is busy: another orch operation holds its lock ({holder})",
                        "wait for it to finish and retry, or raise [run] lock_timeout")
                time.sleep(0.05)
        try:  # best effort: on a full disk the lock must still be taken, so that stop and purge can run
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, json.dumps({"pid": os.getpid(), "what": self.what, "since": time.time()}).encode(), 0)
        except OSError:
            pass
        return self

    def _holder(self) -> str:
        try:
            with open(self.path) as fh:
                info = json.load(fh)
            age = time.time() - float(info.get("since", time.time()))
            return f"{info.get('what', '?')} by pid {info.get('pid')}, for {age:.0f} s"
        except (OSError, ValueError):
            return "unknown holder"

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            try:
                os.ftruncate(self.fd, 0)
            except OSError:
                pass
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
