"""A process's line in ``/proc/<pid>/stat``, read in one place: its state letter, its parent, and its start time
(clock ticks since boot), which with the pid names one process across pid reuse."""

from __future__ import annotations


def fields(pid: object) -> list[str] | None:
    """The fields after the command name (``state`` is the first, the start time the 20th); None when gone."""
    try:
        with open(f"/proc/{int(str(pid))}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError, ValueError):
        return None


def start(pid: object) -> str | None:
    """The process's start time, as the kernel writes it; None when it is gone."""
    found = fields(pid)
    return found[19] if found is not None and len(found) > 19 else None


def state(pid: object) -> str | None:
    found = fields(pid)
    return found[0] if found else None


def parent(pid: object) -> int | None:
    found = fields(pid)
    try:
        return int(found[1]) if found is not None and len(found) > 1 else None
    except ValueError:
        return None


def exited(pid: object) -> bool:
    """Whether the process is gone, or a zombie its parent has not reaped yet."""
    return state(pid) in (None, "Z", "X")


def alive(pid: int | None, started: str | None) -> bool:
    """Whether ``pid`` runs and is still the process that started at ``started`` (None: any process of that pid)."""
    if not pid:
        return False
    now = start(pid)
    if now is None or state(pid) == "Z":
        return False
    return started is None or now == started
