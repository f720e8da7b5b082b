"""The CLI's side of the keeper: a ``Transport`` whose commands run on a connection the keeper holds.

    t = KeptTransport(spec, command_timeout=300, persist=600, direct=lambda: SshTransport(**spec))
    t.run(["uname"])   # through the keeper; the first time, directly while a keeper starts

Nothing here imports paramiko. When no keeper listens (the first command, no private runtime folder,
a keeper that cannot start), commands go over a direct connection, exactly as with ``[ssh] persist = 0``.
A command whose process goes on after its answer (``after_answer.become``) then becomes the keeper itself: it
holds the connections it opened, and their resident agents, as a keeper would have (the next command finds them
up, with no second login and no second agent start). Elsewhere it starts a keeper process in the background, which
opens its own connection once this one has reached the target (``ready``).
"""

from __future__ import annotations

import base64
import functools
import json
import os
import socket
import threading
import time
from typing import Any, Callable

from ... import after_answer, errors, sockets
from ...errors import OrchError, TransportError
from ..transport.base import Input, Output, Result, Transport, pieces
from . import memo, place, wire
from .begin import _ARGV, _EARLY, _PRESPAWNED, _STARTED, _start, _tell, prespawn  # noqa: F401
from .resident import Residents, on_resident


STARTING_WAIT = 2.0  # s a command waits for a keeper another command started a moment ago


def keeper(persist: float) -> socket.socket | None:
    """A connection to this user's keeper. When none listens, one is started in the background for the next
    commands and None returned: this command connects directly rather than wait for it. A keeper that another
    command started a moment ago is waited for (it is readying that command's connection: ``ready``)."""
    try:
        path = place.socket_path()
    except OrchError:
        return None
    sock = sockets.connect(path)
    if sock is not None:
        return sock
    if path in _EARLY:  # started by ``early``, readying this command's connection: its requests go there
        return sockets.wait_for(path, EARLY_WAIT)
    if path in _ADOPTING:
        return None  # this command becomes the keeper once its answer is out: it goes on on its own connection
    if path in _STARTED and sockets.alive(_STARTED[path][0]):
        return None  # the one this command started, still coming up: it goes on on its own connection
    if not sockets.starting(path) and after_answer.become(functools.partial(_listen, path, persist),
                                                          functools.partial(_become, path),
                                                          functools.partial(_start_instead, path, persist)):
        _ADOPTING[path] = []
        return None
    if not _start(path, persist):
        return sockets.wait_for(path, STARTING_WAIT)
    return None


def _start_instead(path, persist: float) -> None:
    """This command goes on until its user ends it (a followed log, a terminal), so it becomes no keeper: start one
    now as its own process, readied at once with the connection and agent this command reached (or, not reached
    yet, once it does: ``ready``). What was handed over for the keeper it would have become is closed."""
    for _spec, transport, residents, _signature in _ADOPTING.pop(path, []):
        _drop(transport, residents)
    if _start(path, persist) and _REACHED:
        _tell(path, _REACHED[0])


_REACHED: list = []  # what this command's first agent call reached on its own connection: {"spec", "agent"}
_ADOPTING: dict = {}  # socket path -> the connections this process hands to the keeper it becomes (``_become``)
_BECOMING: dict = {}  # socket path -> that keeper, listening from just before the answer (``_listen``)


def _hand_over(kept: "KeptTransport") -> bool:
    """Keep ``kept``'s own connection for the keeper this process becomes (which takes it if it is still alive then);
    False (the caller closes it) when it becomes none."""
    try:
        handed = _ADOPTING.get(place.socket_path())
    except OrchError:
        return False
    if handed is None or kept._direct is None:
        return False
    handed.append((kept.spec, kept._direct, kept._residents, kept._signature))
    return True


def _drop(transport: Any, residents: Residents) -> None:
    """Close a connection of this process's own, and its resident agents with it."""
    residents.forget(transport)
    transport.close()


def _listen(path, persist: float) -> None:
    """Just before this command's answer: take the keeper's socket (a command run after this one connects to it, and
    waits the moment until it serves); another keeper may have taken it meanwhile."""
    from .server import Keeper

    keeper = Keeper(path, persist)
    _BECOMING[path] = keeper if keeper.listen() else None


def _become(path) -> None:
    """This process (one that goes on after its answer, whose command found no keeper) becomes the keeper at
    ``path``, holding the connections its command handed over; if another keeper took the socket, they are closed
    and the process ends."""
    import logging

    handed = _ADOPTING.pop(path, [])
    keeper = _BECOMING.pop(path, None)
    left = [h for h in handed if keeper is None or not keeper.adopt(*h)]  # dead, a second to one spec, or no keeper
    for _spec, transport, residents, _signature in left:
        _drop(transport, residents)
    if keeper is None:
        return
    try:
        os.setsid()  # a session of its own, as a keeper started in the background has
    except OSError:
        pass
    os.chdir("/")
    logging.getLogger("paramiko").addHandler(logging.NullHandler())
    try:
        keeper.serve()
    finally:
        keeper.close(None)


def ready(spec: dict, agent: list[str] | None) -> None:
    """Tell the keeper this process started (if it did) to open ``spec``'s connection and start the agent ``agent``
    there now: this command has reached the target on its own connection, so the keeper's login is one that works,
    and the next command finds both up. A command that never reached its target tells nothing (its keeper sees the
    pipe close and opens nothing)."""
    if not _REACHED:
        _REACHED.append({"spec": spec, "agent": agent or None})
    for path in list(_STARTED):
        _tell(path, {"spec": spec, "agent": agent or None})


def early(transport: Transport, agent: Callable[[], list[str]], files: list[str] = ()) -> None:
    """In an ``orch`` process that loaded orch for this command (not one holding upkeep for after its answer), when
    no keeper listens: start one now, told at once to open ``transport``'s connection (a ``KeptTransport``) and
    start the agent ``agent()`` there, and have this command's requests wait for it. The first command of the day
    would otherwise load paramiko, log in and start the agent itself only once its own imports and preparations are
    done, one after the other; the keeper does that on the other CPU meanwhile (and the target its part), and the
    next commands find both up. Its connection is checked as any keeper's (strict host keys, the trust files'
    signature), and the command's own requests, with a CT's identity, go as before. A process that holds its upkeep
    (``after_answer.holding``) had orch loaded before the command: its own connection is sooner up than a new
    process's, and it becomes the keeper after its answer (``keeper``). What the keeper is told is noted for the
    next time these words are typed here (``memo``), valid while ``files`` (the settings' sources) are unchanged."""
    if not isinstance(transport, KeptTransport) or after_answer.holding():
        return
    try:
        path = place.socket_path()
    except OrchError:
        return
    told = {"spec": transport.spec, "agent": agent(), "idle": transport.persist}
    if _ARGV:
        memo.remember(_ARGV[0], place.code_digest(), [str(f) for f in files], told)
    if path in _PRESPAWNED:  # started as this command began (``prespawn``): told now
        _PRESPAWNED.discard(path)
        _EARLY.add(path)
        _tell(path, told)
        return
    if path in _STARTED or path in _ADOPTING or path in _EARLY:
        return  # told already (the connection recalled as this command began, this one or another), or coming up
    sock = sockets.connect(path)
    if sock is not None:  # a keeper holds (or opens) the connection
        sock.close()
        return
    if sockets.starting(path) or not _start(path, transport.persist):
        return  # another command's keeper is coming up: the requests wait for it (``keeper``)
    _EARLY.add(path)
    _tell(path, {"spec": told["spec"], "agent": told["agent"]})


EARLY_WAIT = 10.0  # s a command waits for the keeper it started early to listen (its start is ~0.3 s of CPU)


SMALL_INPUT = 1 << 16  # bytes of input sent behind the request itself; a larger one is streamed by a thread


class KeptTransport(Transport):
    """An SSH target reached through the keeper; ``direct`` makes the plain ``SshTransport`` used as the
    fallback and for interactive sessions (a terminal, port forwarding)."""

    streams = True

    def __init__(self, spec: dict, *, command_timeout: float | None, persist: float,
                 direct: Callable[[], Transport]) -> None:
        super().__init__()
        self.spec = spec
        self.command_timeout = command_timeout
        self.persist = persist
        self._make_direct = direct
        self._direct: Transport | None = None
        self._signature: list = []  # the trust files as the direct connection was made (a keeper checks them)
        self._residents = Residents()  # the resident agents on the direct connection, when it is used
        user, host, port = spec.get("user"), spec["host"], spec.get("port")
        self.description = f"{user + '@' if user else ''}{host}{':' + str(port) if port else ''}"

    def retarget(self, host: str) -> None:
        """From now on the keeper's connection to ``host`` (a held one is another spec), or a direct one there."""
        if self._direct is not None:
            _drop(self._direct, self._residents)
            self._direct = None
        make = self._make_direct

        def moved() -> Transport:
            transport = make()
            transport.retarget(host)
            return transport

        self._make_direct = moved
        self.spec = {**self.spec, "host": host}
        user, port = self.spec.get("user"), self.spec.get("port")
        self.description = f"{user + '@' if user else ''}{host}{':' + str(port) if port else ''}"

    def direct(self) -> Transport:
        if self._direct is None:
            from .server import trust_signature

            self._signature = trust_signature(self.spec)  # before it connects: what its checks will be made against
            self._direct = self._make_direct()
            self._direct.stats = self.stats
        return self._direct

    def _request(self, request: dict, data: Input, output: Output, limit: float | None) -> dict:
        """Send ``request`` and ``data`` to the keeper; stdout pieces go to ``output``; the final answer."""
        for _ in range(2):
            sock = keeper(self.persist)
            if sock is None:
                raise _NoKeeper()
            try:
                return self._exchange(sock, request, data, output, limit)
            except _NotAccepted:
                continue  # the keeper was exiting (idle) as we connected: the next one takes it
            finally:
                sock.close()
        raise _NoKeeper()

    def _exchange(self, sock: socket.socket, request: dict, data: Input, output: Output,
                  limit: float | None) -> dict:
        failed: list[BaseException] = []

        def feed() -> None:
            try:
                for piece in pieces(data):
                    wire.send(sock, b"I", piece)
                    self.stats.bytes_sent += len(piece)
                wire.send(sock, b"E")
            except OrchError as exc:  # the stream itself failed (a local file vanished): stop the command
                failed.append(exc)
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                return

        try:
            wire.send_json(sock, b"H", request)
        except OSError:  # the keeper went away before it read the request (killed, exiting): nothing ran there
            raise _NotAccepted() from None
        # a small input (an agent call's request) goes at once, behind the request, with no thread of its own:
        # it fits in the socket's buffer, and the keeper reads it once it has taken the request
        small = data is None or (isinstance(data, (bytes, bytearray, memoryview)) and len(data) <= SMALL_INPUT)
        if small:
            try:
                for piece in pieces(data):
                    wire.send(sock, b"I", piece)
                    self.stats.bytes_sent += len(piece)
                wire.send(sock, b"E")
            except OSError:
                pass  # the keeper's answer (or its absence) below says what it did
        if limit is not None:  # the keeper enforces the limit; this only guards against a stuck keeper
            sock.settimeout(limit + 3 * float(self.spec.get("connect_timeout") or 10) + 30)
        try:
            kind, _ = wire.recv(sock)
        except (wire.Closed, OSError):
            raise _NotAccepted() from None
        if kind != b"A":
            raise _NotAccepted()
        if not small:
            threading.Thread(target=feed, daemon=True).start()
        out = bytearray()
        try:
            while True:
                kind, body = wire.recv(sock)
                if kind == b"O":
                    if output is not None:
                        self.stats.bytes_received += len(body)
                        output(body)
                    else:
                        out += body
                elif kind == b"R":
                    answer = json.loads(body)
                    answer["stdout"] = bytes(out)
                    return answer
                elif kind == b"F":
                    raise _error(json.loads(body))
        except (wire.Closed, OSError) as exc:
            if failed:
                raise failed[0] from None
            what = request.get("argv", ["the command"])[0] if request["op"] == "run" else "a file write"
            raise TransportError(f"the connection keeper went away while {what} ran on {self.description}; "
                                 "the command may or may not have run",
                                 hint="check the target's state before running it again; "
                                      "orch connections list shows the keepers") from exc

    def run(self, argv: list[str], *, input: Input = None, timeout: float | None = None,
            stall: float | None = None, output: Output = None) -> Result:
        return self._run("run", argv, input, timeout, stall, output)

    def run_agent(self, argv: list[str], *, input: Input = None, timeout: float | None = None,
                  stall: float | None = None, output: Output = None) -> Result:
        """``run`` for an agent call: answered by a resident agent on the held connection when one serves."""
        return self._run("agent", argv, input, timeout, stall, output)

    def _run(self, op: str, argv: list[str], input: Input, timeout: float | None, stall: float | None,
             output: Output) -> Result:
        if not argv:
            raise errors.InputError("empty command", hint="pass the program and its arguments as a list")
        limit = timeout if timeout is not None else (self.command_timeout if stall is None else None)
        if self._direct is not None:
            return self._run_direct(op, argv, input, timeout, stall, output, limit)
        request = {"op": op, "spec": self.spec, "argv": list(argv), "timeout": limit, "stall": stall,
                   "stream": output is not None}
        try:
            answer = self._request(request, input, output, limit)
        except _NoKeeper:
            result = self._run_direct(op, argv, input, timeout, stall, output, limit)
            if op == "agent":
                ready(self.spec, list(argv))
            return result
        self.stats.commands += 1
        self.stats.connections += answer.get("connections", 0)
        if answer.get("resident"):
            self.stats.extra["resident"] = self.stats.extra.get("resident", 0) + 1
        stderr = base64.b64decode(answer.get("stderr", ""))
        self.stats.bytes_received += len(answer["stdout"]) + len(stderr)
        return Result(list(argv), int(answer["exit_code"]), answer["stdout"], stderr)

    def _run_direct(self, op: str, argv: list[str], input: Input, timeout: float | None, stall: float | None,
                    output: Output, limit: float | None) -> Result:
        """On this process's own connection; an agent call on a resident agent there, as the keeper would."""
        direct = self.direct()
        if op == "agent":
            out = bytearray()
            rest = on_resident(self._residents, direct, list(argv), pieces(input), output or out.extend, limit, stall,
                               None)
            if rest is None:
                self.stats.commands += 1
                self.stats.extra["resident"] = self.stats.extra.get("resident", 0) + 1
                self.stats.bytes_received += len(out)
                return Result(list(argv), 0, bytes(out), b"")
            input = rest
        return direct.run(argv, input=input, timeout=timeout, stall=stall, output=output)

    def run_bulk(self, argv: list[str], *, open: Callable[[], Input], stall: float | None = None) -> Result:
        """On a connection of this process, never relayed byte by byte through the keeper; one made for the stream
        alone, so that the commands after it still go through the keeper."""
        if self._direct is not None:
            return self._direct.run_bulk(argv, open=open, stall=stall)
        own = self._make_direct()
        own.stats = self.stats
        try:
            return own.run_bulk(argv, open=open, stall=stall)
        finally:
            own.close()

    def put(self, data: bytes, path: str, mode: int = 0o644) -> None:
        if self._direct is not None:
            return self._direct.put(data, path, mode)
        request = {"op": "put", "spec": self.spec, "path": path, "mode": mode}
        try:
            answer = self._request(request, data, None, self.command_timeout)
        except _NoKeeper:
            return self.direct().put(data, path, mode)
        self.stats.connections += answer.get("connections", 0)
        return None

    def alive(self) -> bool:
        return self._direct.alive() if self._direct is not None else True

    def open_channel(self, argv: list[str] | None, *, pty: tuple[str, int, int] | None = None) -> Any:
        return self.direct().open_channel(argv, pty=pty)

    def open_tunnel(self, host: str, port: int, origin: tuple[str, int]) -> Any:
        return self.direct().open_tunnel(host, port, origin)

    def close(self) -> None:
        """Close the direct connection, unless the keeper this process becomes holds it from now on."""
        if self._direct is not None and not _hand_over(self):
            _drop(self._direct, self._residents)
        self._direct = None


class _NoKeeper(Exception):
    """No keeper could be reached or started: use a direct connection."""


class _NotAccepted(Exception):
    """The keeper closed the socket before taking the request: it never ran."""


def _error(info: dict) -> OrchError:
    cls = getattr(errors, str(info.get("cls")), None)
    if not (isinstance(cls, type) and issubclass(cls, OrchError)):
        cls = TransportError
    return cls(str(info.get("message") or "the connection keeper failed"), hint=info.get("hint"),
               detail=info.get("detail"))


def ask(sock: socket.socket, request: dict) -> Any:
    """One short request (list, close) to a keeper; its answer."""
    sock.settimeout(5)
    wire.send_json(sock, b"H", request)
    if wire.recv(sock)[0] != b"A":
        raise wire.Closed("not accepted")
    kind, body = wire.recv(sock)
    if kind != b"R":
        raise wire.Closed("no answer")
    return json.loads(body)


def keepers() -> list[dict]:
    """Every live keeper of this user (any home or orch version), with its connections and whether it is the
    caller's own (``mine``). Sockets left by a keeper that crashed are removed."""
    found = []
    try:
        paths = place.socket_paths()
    except OrchError:
        return []
    for path in paths:
        sock = sockets.connect(path)
        if sock is None:
            sockets.remove_if_stale(path)
            continue
        try:
            answer = ask(sock, {"op": "list"})
        except (wire.Closed, OSError, ValueError):
            continue
        finally:
            sock.close()
        found.append({"socket": str(path), **answer, "mine": sockets.mine(path)})
    return found


def close(match: str | None = None, everyone: bool = False) -> int:
    """Close the held connections whose target matches ``match`` (all, and their keepers exit, when None), in
    the caller's own keepers (same home and installation; ``everyone``: all of this user's)."""
    closed = 0
    for item in keepers():
        if not (everyone or item["mine"]):
            continue
        sock = sockets.connect(item["socket"])
        if sock is None:
            continue
        try:
            closed += int(ask(sock, {"op": "close", "match": match, "exit": match is None}).get("closed", 0))
        except (wire.Closed, OSError, ValueError):
            continue
        finally:
            sock.close()
        deadline = time.monotonic() + 5
        while match is None and os.path.exists(item["socket"]) and time.monotonic() < deadline:
            time.sleep(0.01)  # the keeper removes its socket as it exits
        pid = int(item.get("pid") or 0)
        while match is None and pid not in (0, os.getpid()) and sockets.alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)  # and then lets its lock go: the next command can become the keeper at once
    return closed
