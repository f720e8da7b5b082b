"""Upkeep a command may leave until its answer is out: what the user waits for ends at the answer, the rest follows.

The registry's SQLite file is the case: the last connection to close checkpoints its write-ahead log into the
file (two syncs and a delete: 2-15 ms on a busy disk) though everything the command wrote was committed already.
In a warm orch process's child, which runs one command and exits, the first close of the command's own registry
(``Registry(park=True)``) is parked here instead, still open; while it is, any other connection to the same file
closes at once (it is not the last), and the parked one is closed after the exit code has gone back to the caller::

    after_answer.hold()                # the warm child, before the command
    ...  after_answer.park(db.close)   # Registry.close in the main thread: parked (or, not holding: closed now)
    ...  send the exit code
    after_answer.finish()              # closed here: the checkpoint runs while the caller's prompt is back

Work that only readies later commands (a remembered Proxmox lookup, reused past its TTL, asked again) is queued
with ``later``: after the answer in a warm child, not at all elsewhere, where the prompt would wait for it.

A registry file that the command goes on to move (a rebuilt one) is never parked: it must be whole, its log folded
in, when its close returns.

What the process turns into once everything else is done is queued with ``become`` (one job, in a warm child only):
a command that reached a target with no connection keeper up becomes that keeper, its connection and resident agent
held as they are, so the next command finds both up at once. Its ``prepare`` runs as the answer goes out
(``answering``): after the exit code was sent, which reaches the caller even if this process is killed meanwhile,
and before the caller exits (it waits for the warm child's word that this is done), so the keeper's socket is
there before the caller can run another command.

A command that runs on until its user ends it (a followed log, a terminal, a forward) says so with ``goes_on``: the
next commands must not wait for its end to find a keeper. It becomes nothing; what it was to become is started
now in its place (``become``'s ``instead``: a keeper process, readied with this command's connection and agent).

Only the main thread parks (an SQLite connection is closed in the thread that opened it). Anywhere else (``orch``
run in its own process, a thread) a closer runs at once, as before.
"""

from __future__ import annotations

import threading
from typing import Callable

_parked: list[Callable[[], None]] | None = None  # None: not holding, closers run at once
_later: list[Callable[[], None]] = []  # what readies later commands, run after the parked closers
# (prepare, job, instead): what the process turns into, and what starts in its place if the command goes on
_become: tuple[Callable[[], None], Callable[[], None], Callable[[], None] | None] | None = None
_goes_on = False  # the command runs until its user ends it (``goes_on``): it becomes nothing


def hold() -> None:
    """From now on the main thread's first closer waits for ``finish``."""
    global _parked, _goes_on
    _parked = []
    _goes_on = False


def holding() -> bool:
    """Whether this process is a warm child holding its upkeep for after the answer (``hold``)."""
    return _parked is not None


def park(closer: Callable[[], None]) -> None:
    """Run ``closer`` now, or after the answer: when holding, in the main thread, and none is parked yet."""
    if _parked is None or _parked or threading.current_thread() is not threading.main_thread():
        closer()
        return
    _parked.append(closer)


def later(job: Callable[[], None]) -> bool:
    """Queue ``job`` for after the answer; False (nothing queued) when not holding."""
    if _parked is None:
        return False
    _later.append(job)
    return True


def become(prepare: Callable[[], None], job: Callable[[], None], instead: Callable[[], None] | None = None) -> bool:
    """Queue ``job`` to run last, after the answer and everything ``later``, and ``prepare`` as the answer goes out
    (quick: the caller waits for it); ``instead`` runs in their place if the command turns out to go on
    (``goes_on``). False (nothing queued) when not holding, another is queued already, or the command goes on."""
    global _become
    if _parked is None or _become is not None or _goes_on:
        return False
    _become = (prepare, job, instead)
    return True


def goes_on() -> None:
    """The command runs until its user ends it (a followed log, a terminal): it becomes nothing, and what it was to
    become is replaced now by its ``instead`` (whose failure is nobody's to hear: the command goes on)."""
    global _become, _goes_on
    _goes_on = True
    queued, _become = _become, None
    if queued is not None and queued[2] is not None:
        try:
            queued[2]()
        except Exception:  # noqa: BLE001
            pass


def answering() -> None:
    """The answer is going out (its exit code is sent; the caller exits once this returns): what the process will
    become prepares its place (its failure is the job's to meet)."""
    if _become is not None:
        try:
            _become[0]()
        except Exception:  # noqa: BLE001
            pass


def finish() -> None:
    """Run what was parked, then what was queued for later, then what the process becomes (their failures are
    nobody's to hear: the answer is out), and stop holding."""
    global _parked, _become
    parked, _parked = [*(_parked or []), *_later, *([_become[1]] if _become is not None else [])], None
    _later.clear()
    _become = None
    for closer in parked:
        try:
            closer()
        except Exception:  # noqa: BLE001 (a checkpoint that fails leaves the log for the next opener)
            pass
