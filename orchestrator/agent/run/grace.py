"""A stop's grace period counts only the time the run could act on the signal.

    clock = Grace(seconds=30, pid=child)
    while not ended():
        if clock.tick():          # True once 30 s of the run's own time have passed
            break                 # -> the next signal (SIGTERM, SIGKILL)

Not counted: a gap in this process's own clock (the whole container was frozen, or the machine stood still:
nothing ran, the run neither), and the time the run's process is stopped (state ``T``), frozen by its
cgroup's freezer, or in uninterruptible sleep (``D``, which is also how a frozen task shows in cgroup v1);
those last ones for at most ``max(60 s, 4 x the grace period)``, so a process stuck for good is still ended.
"""

from __future__ import annotations

import time

from .. import procstat

GAP = 1.0  # a step of the wait loop longer than this: we were not running either


def _cgroup_frozen(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cgroup") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return False
    for line in lines:
        _, controllers, path = line.split(":", 2)
        try:
            if controllers == "":  # cgroup v2
                with open(f"/sys/fs/cgroup{path}/cgroup.events") as fh:
                    if "frozen 1" in fh.read():
                        return True
            elif "freezer" in controllers.split(","):
                with open(f"/sys/fs/cgroup/freezer{path}/freezer.state") as fh:
                    if fh.read().strip() in ("FROZEN", "FREEZING"):
                        return True
        except OSError:
            continue
    return False


def held(pid: int | None) -> bool:
    """Whether process ``pid`` cannot act on a signal now: stopped, frozen, or in uninterruptible sleep."""
    if not pid:
        return False
    state = procstat.state(pid)
    return state is not None and (state in ("T", "t", "D") or _cgroup_frozen(int(pid)))


class Grace:
    def __init__(self, seconds: float, pid: int | None = None) -> None:
        self.seconds = seconds
        self.pid = pid
        self.counted = 0.0
        self.excused = 0.0
        self.limit = max(60.0, 4 * seconds)
        self.last = time.monotonic()

    def tick(self) -> bool:
        """Account for the time since the last tick; True once the grace period is used up."""
        now = time.monotonic()
        step, self.last = now - self.last, now
        if step > GAP:
            step = 0.0  # frozen with the run: none of it was the run's time
        elif self.excused < self.limit and held(self.pid):
            self.excused += step
            step = 0.0
        self.counted += step
        return self.counted >= self.seconds
