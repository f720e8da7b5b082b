"""The CLI's side of the keeper: a ``Transport`` whose commands run on a connection the keeper holds.

    t = KeptTransport(spec, command_timeout=300, persist=600, direct=lambda: SshTransport(**spec))
    t.run(["uname"])   # through the keeper; the first time, directly while a keeper starts

Nothing here imports paramiko or fabric. When no keeper listens (the first command, no private runtime folder,
a keeper that cannot start), commands go over a direct connection, exactly as with ``[ssh] persist = 0``.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable

from ... import errors
from ...errors import OrchError, TransportError
from ..transport.base import Input, Output, Result, Transport, pieces
from . import place, wire

SPAWN_WAIT = 10.0  # s a keeper being started is given before another command starts one


def _connect(path: str, timeout: float = 2.0) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    sock.settimeout(None)
    return sock


def spawn(path: str, persist: float) -> int:
    """Start a keeper for ``path`` in a session of its own (Ctrl-C in this terminal does not reach it)."""
    log = os.open(f"{path[:-len(place.SUFFIX)]}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        return subprocess.Popen([sys.executable, "-m", "orchestrator.reach.keeper", path, str(persist)], cwd="/",
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                start_new_session=True, close_fds=True).pid
    finally:
        os.close(log)


def keeper(persist: float) -> socket.socket | None:
    """A connection to this user's keeper. When none listens, one is started in the background for the next
    commands and None returned: this command connects directly rather than wait for it."""
    try:
        path = str(place.socket_path())
    except OrchError:
        return None
    sock = _connect(path)
    if sock is not None:
        return sock
    marker = f"{path[:-len(place.SUFFIX)]}.spawned"
    if _starting(marker):
        return None
    try:
        with open(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
            fh.write(str(spawn(path, persist)))
    except OSError:
        pass
    return None


def _starting(marker: str) -> bool:
    """Whether a keeper started a moment ago is still coming up: commands meanwhile do not start more."""
    try:
        with open(marker) as fh:
            pid = int(fh.read().strip() or 0)
        if time.time() - os.stat(marker).st_mtime >= SPAWN_WAIT or pid <= 0:
            return False
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return state not in (b"Z", b"X") and b"orchestrator.reach.keeper" in fh.read()
    except (OSError, ValueError, IndexError):
        return False  # no marker, or its keeper is gone (crashed, or exited idle)


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
        user, host, port = spec.get("user"), spec["host"], spec.get("port")
        self.description = f"{user + '@' if user else ''}{host}{':' + str(port) if port else ''}"

    def direct(self) -> Transport:
        if self._direct is None:
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

        wire.send_json(sock, b"H", request)
        if limit is not None:  # the keeper enforces the limit; this only guards against a stuck keeper
            sock.settimeout(limit + 3 * float(self.spec.get("connect_timeout") or 10) + 30)
        try:
            kind, _ = wire.recv(sock)
        except (wire.Closed, OSError):
            raise _NotAccepted() from None
        if kind != b"A":
            raise _NotAccepted()
        sender = threading.Thread(target=feed, daemon=True)
        sender.start()
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
        if self._direct is not None:
            return self._direct.run(argv, input=input, timeout=timeout, stall=stall, output=output)
        limit = timeout if timeout is not None else (self.command_timeout if stall is None else None)
        request = {"op": op, "spec": self.spec, "argv": list(argv), "timeout": limit, "stall": stall,
                   "stream": output is not None}
        try:
            answer = self._request(request, input, output, limit)
        except _NoKeeper:
            return self.direct().run(argv, input=input, timeout=timeout, stall=stall, output=output)
        self.stats.commands += 1
        self.stats.connections += answer.get("connections", 0)
        if answer.get("resident"):
            self.stats.extra["resident"] = self.stats.extra.get("resident", 0) + 1
        stderr = base64.b64decode(answer.get("stderr", ""))
        self.stats.bytes_received += len(answer["stdout"]) + len(stderr)
        return Result(list(argv), int(answer["exit_code"]), answer["stdout"], stderr)

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

    def close(self) -> None:
        if self._direct is not None:
            self._direct.close()


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
    """Every live keeper of this user (any home or orch version), with its connections. Sockets left by a
    keeper that crashed are removed."""
    import fcntl

    found = []
    try:
        paths = place.sockets()
    except OrchError:
        return []
    for path in paths:
        sock = _connect(str(path))
        if sock is None:
            lock = os.open(f"{path}.lock", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody serves it: a crashed keeper's
                path.unlink(missing_ok=True)
            except OSError:
                pass  # a keeper is starting on it
            finally:
                os.close(lock)
            continue
        try:
            answer = ask(sock, {"op": "list"})
        except (wire.Closed, OSError, ValueError):
            continue
        finally:
            sock.close()
        found.append({"socket": str(path), **answer})
    return found


def warm_processes() -> list[dict]:
    """The warm orch processes of this user (see ``warm.py``): socket and pid."""
    found = []
    try:
        paths = sorted(place.folder().glob(f"warm-*{place.SUFFIX}"))
    except OrchError:
        return []
    for path in paths:
        marker = f"{str(path)[:-len(place.SUFFIX)]}.spawned"
        try:
            with open(marker) as fh:
                pid = int(fh.read().strip())
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if str(path).encode() in fh.read():
                    found.append({"socket": str(path), "pid": pid})
        except (OSError, ValueError):
            continue
    return found


def close(match: str | None = None) -> int:
    """Close the held connections whose target matches ``match`` (all, and their keepers and the warm orch
    processes, when None)."""
    if match is None:
        import signal

        for item in warm_processes():
            try:
                os.kill(item["pid"], signal.SIGTERM)
            except OSError:
                pass
    closed = 0
    for item in keepers():
        sock = _connect(item["socket"])
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
            time.sleep(0.05)  # the keeper removes its socket as it exits
    return closed
