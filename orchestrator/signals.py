"""SIGTERM and SIGHUP during an operation take Ctrl-C's path, so its experiment is settled before orch exits.

A closed terminal (SIGHUP) or a ``kill``/service stop (SIGTERM) would otherwise end orch at once and leave
the new experiment ``launching``. Delivered as an interrupt, every ``except KeyboardInterrupt`` path that
records what the target did handles them too. Outside ``as_interrupts`` they keep their default action.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the main thread was."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def describe(exc: BaseException) -> tuple[str, int]:
    """How to say an interruption ("interrupted", "interrupted by SIGTERM") and the exit code it gives."""
    if isinstance(exc, Terminated):
        return f"interrupted by {exc.name}", 128 + exc.signum
    return "interrupted", 130


@contextmanager
def as_interrupts(signums: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():  # handlers can only be set there
        yield
        return

    def interrupt(signum: int, _frame: object) -> None:
        raise Terminated(signum)

    previous = {s: signal.signal(s, interrupt) for s in signums}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
