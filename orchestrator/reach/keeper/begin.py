"""The first moments of an ``orch`` command that asks a target: its keeper started before the command's own imports.

Only what that needs is loaded here (no transport, no typing's dataclasses): the sooner the keeper's own start
(Python's and paramiko's) begins, the sooner it logs in. ``client.py`` goes on from here (``early``, ``keeper``)
with the same records of the keepers this process started.
"""

from __future__ import annotations

import json
import os

from ... import after_answer, sockets
from ...errors import OrchError
from . import memo, place

PRESPAWN_IDLE = 600.0  # s a keeper started before the settings were read idles: [ssh] persist's default, until told
_STARTED: dict = {}  # socket path -> (pid, the pipe to it: -1 once told) of the keeper this process started
_EARLY: set = set()  # socket paths of the keepers this command started early, told what to ready at once
_PRESPAWNED: set = set()  # socket paths of the keepers this command started as it began, not told anything yet
_ARGV: list = []  # this command's words, once ``prespawn`` saw them: what ``early`` notes its connection under


def prespawn(argv: list[str] = ()) -> None:
    """As a command that reaches a target begins, in an ``orch`` process of its own (``early``'s case), with no
    keeper up: start one before the command's own imports, so that its start (Python's and paramiko's, which it
    loads while it waits) goes on beside them. When the same words were typed here before and what they depend on
    is unchanged (``memo.recall``), it is told that command's connection at once, and logs in while this command
    still loads; otherwise ``early`` tells it once the command knows its target. Told nothing (a local target,
    ``[ssh] persist = 0``, a command that failed before), it exits."""
    if after_answer.holding():
        return
    _ARGV[:] = [list(argv)]
    try:
        path = place.socket_path()
    except OrchError:
        return
    sock = sockets.connect(path)
    if sock is not None:
        sock.close()
        return
    if sockets.starting(path):
        return
    told = memo.recall(list(argv), place.code_digest())
    if not _start(path, float(told.get("idle") or PRESPAWN_IDLE) if told else PRESPAWN_IDLE, early=True):
        return
    if told is None:
        _PRESPAWNED.add(path)
        return
    _EARLY.add(path)
    _tell(path, told)


def _start(path, persist: float, early: bool = False) -> bool:
    """Start a keeper process at ``path`` in the background, its pipe kept to tell it what to ready (``ready``);
    False when another one is starting there. An ``early`` one exits when the pipe closes with nothing told."""
    told, tell = os.pipe()
    try:
        started = sockets.spawn(path, place.MODULE, str(persist), *(["early"] if early else []), stdin=told)
    finally:
        os.close(told)
    if started is None:
        os.close(tell)
        return False
    _tell(path, None)  # the pipe to one this process started before, gone since
    _STARTED[path] = (started, tell)
    return True


def _tell(path, asked: dict | None) -> None:
    """Send ``asked`` (None: nothing) down the pipe to the keeper this process started for ``path``, and close it."""
    pid, tell = _STARTED.get(path, (0, -1))
    if tell < 0:
        return
    _STARTED[path] = (pid, -1)
    try:
        if asked is not None:
            os.write(tell, json.dumps(asked).encode() + b"\n")
    except OSError:
        pass
    finally:
        os.close(tell)
