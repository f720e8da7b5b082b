"""The restart policy of a run, on the target: when to try again, from which checkpoint, and the record.

The supervisor (``runs.supervise``) asks this module three things, with no controller connected::

    policy = Policy.from_dict(launch.get("recovery"))
    policy.restart_after(attempt=0, code=1, reason="exit code 1")   # -> True while restarts remain
    newest_checkpoint("/ckpt/proj", glob=None)                        # -> "/ckpt/proj/ckpt-40.pt" or ""

and keeps every attempt in ``runs/<id>/attempts.json`` (written atomically): start, end, exit code,
reason and the checkpoint it resumed from. A stop (``stop_requested``) is never a failure to restart from.
An attempt cut short by a reboot (reason ``lost``, or ``interrupted by the container's shutdown`` when the
supervisor saw the shutdown's SIGTERM) costs no restart: the attempt after boot is one more.
"""

from __future__ import annotations

import fnmatch
import os
import time
from dataclasses import dataclass, field

from .causes import SHUTDOWN
from ..diskspace import FULL
from ..layout import read_json, write_json
from .recorded import ATTEMPTS as FILE, attempts as summary  # (status reads them without this module)

STOP_FILE = "stop_requested"


@dataclass(frozen=True)
class Policy:
    restarts: int = 0
    restart_on: str = "failure"  # "failure": a non-zero exit or a stall; "always": any exit
    backoff: tuple[float, ...] = (10.0, 30.0, 60.0)
    stall_timeout: float | None = None
    term_timeout: float = 10.0
    checkpoint_glob: str | None = None
    resume_after_reboot: bool = False
    job: dict | None = None  # a node of a job over several nodes: its stalls are the job's (``heartbeat``)
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, raw: dict | None) -> "Policy":
        raw = dict(raw or {})
        backoff = tuple(float(x) for x in raw.pop("backoff", None) or (0.0,))
        known = {k: raw.pop(k) for k in list(raw) if k in cls.__dataclass_fields__ and k != "extra"}
        return cls(backoff=backoff, **known, extra=raw)

    @property
    def attempts(self) -> int:
        return self.restarts + 1

    def restart_after(self, attempt: int, code: int, reason: str, lost: int = 0) -> bool:
        """Whether attempt ``attempt`` (0-based), which ended with ``code`` for ``reason``, is followed by another.

        ``lost``: attempts cut short by a reboot, which do not count against ``restarts``.
        """
        if reason in ("stopped", "budget") or attempt + 1 >= self.attempts + lost:
            return False
        return self.restart_on == "always" or code != 0 or reason == "stalled"

    def delay(self, attempt: int) -> float:
        """Seconds to wait before attempt ``attempt`` (1-based among restarts); the last value repeats."""
        return self.backoff[min(attempt - 1, len(self.backoff) - 1)] if self.backoff else 0.0


def newest_checkpoint(folder: str, glob: str | None = None, skip: frozenset[str] = frozenset()) -> str:
    """The newest entry (file or folder, by mtime) in ``folder`` matching ``glob``; hidden ones never count, nor
    do the names in ``skip`` (another experiment's folder an older orch nested there: ``ckpt_layout``)."""
    if not folder:
        return ""
    try:
        entries = [e for e in os.scandir(folder) if not e.name.startswith(".") and e.name not in skip]
    except OSError:
        return ""
    if glob:
        entries = [e for e in entries if fnmatch.fnmatch(e.name, glob)]
    best, best_mtime = "", -1.0
    for entry in entries:
        try:
            mtime = entry.stat().st_mtime
        except OSError:
            continue  # removed meanwhile
        if mtime > best_mtime or (mtime == best_mtime and entry.path > best):
            best, best_mtime = entry.path, mtime
    return best


def reason_for(code: int, sig: int | None, stalled: bool) -> str:
    if stalled:
        return "stalled"
    if sig:
        return f"signal {sig}"
    return f"exit code {code}"


def marker(attempt: int, total: int, previous: dict | None, resumed_from: str) -> str:
    """The line written to train.log before attempt ``attempt`` (0-based); the first attempt has none."""
    if not previous:
        return ""
    why = previous.get("reason")
    if why == "lost":
        why = "a container restart (lost)"
    elif why in SHUTDOWN:
        why = why.removeprefix("interrupted by ")  # "after the container's shutdown"
    line = f"[orch] attempt {attempt + 1} of {total} after {why}"
    line += f"; resuming from {resumed_from}" if resumed_from else "; no checkpoint to resume from"
    return line + "\n"


def attempt_env(attempt: int, resumed_from: str) -> dict:
    """What the command of attempt ``attempt`` (0-based) is told; ``ORCH_RESUME`` only from the second on."""
    env = {"ORCH_ATTEMPT": str(attempt), "ORCH_RESUME_FROM": resumed_from}
    return env | ({"ORCH_RESUME": "1"} if attempt else {})


def stop_requested(run_dir: str) -> bool:
    return os.path.exists(os.path.join(run_dir, STOP_FILE))


def wait_backoff(run_dir: str, seconds: float, stopping: list) -> bool:
    """Sleep before the next attempt; False as soon as the run is stopped (file or signal): no more attempts."""
    deadline = time.monotonic() + seconds
    while True:
        if stopping or stop_requested(run_dir):
            return False
        left = deadline - time.monotonic()
        if left <= 0:
            return True
        time.sleep(min(0.05, left))


class History:
    """``attempts.json``: ``{"max": N, "attempts": [...], "waiting_until": t | null}``."""

    def __init__(self, run_dir: str, policy: Policy) -> None:
        self.path = os.path.join(run_dir, FILE)
        old = read_json(self.path, {}) or {}
        self.data = {"max": policy.attempts, "attempts": list(old.get("attempts") or []), "waiting_until": None}
        self.close_lost()  # a supervisor started again after a reboot: the open attempt was cut short
        self.data["max"] = policy.attempts + self.lost  # a reboot is not the run's failure: it costs no restart

    @property
    def items(self) -> list[dict]:
        return self.data["attempts"]

    @property
    def lost(self) -> int:
        """Attempts a reboot cut short: killed with their container (``lost``) or ended by its shutdown."""
        return sum(1 for a in self.items if a.get("reason") == "lost" or a.get("reason") in SHUTDOWN)

    def _save(self) -> None:
        try:
            write_json(self.path, self.data)
        except OSError as exc:  # a full disk: the record waits in memory for the next save, the run goes on
            if exc.errno not in FULL:
                raise

    def begin(self, resumed_from: str) -> dict:
        entry = {"attempt": len(self.items), "started": time.time(), "ended": None, "exit_code": None,
                 "reason": None, "resumed_from": resumed_from or None}
        self.items.append(entry)
        self.data["waiting_until"] = None
        self._save()
        return entry

    def end(self, code: int | None, reason: str) -> None:
        self.items[-1].update(ended=time.time(), exit_code=code, reason=reason)
        self._save()

    def waiting(self, until: float) -> None:
        self.data["waiting_until"] = until
        self._save()

    def close_lost(self) -> None:
        """An attempt left open by a supervisor that vanished (a reboot): it ended, its code is unknown."""
        if self.items and self.items[-1].get("ended") is None:
            self.items[-1].update(ended=time.time(), reason="lost")
            self._save()
