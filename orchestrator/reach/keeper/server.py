"""The keeper process: holds one ``SshTransport`` per connection spec and serves requests on its socket.

Each request gets a thread. A held connection is reused while it is alive and while the files that decide
whom it trusts (known_hosts, the trust file, the SSH config) are unchanged; otherwise it is closed and opened
again with the full checks. A command that could not start because the held connection had died is sent once
more on a fresh one (it never ran); a command that was running when the connection died is never repeated.
When the orch command on the other end goes away (Ctrl-C), its SSH channel is closed, as a direct connection's
would be.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ... import sockets
from ...errors import OrchError, TransportError
from . import wire
from .resident import Residents, on_resident

TRUST_FILES = ("~/.ssh/config", "/etc/ssh/ssh_config")


def trust_signature(spec: dict) -> list:
    """What each file that decides this connection's trust and route looks like now (None: missing)."""
    paths = [*(spec.get("known_hosts_files") or []), spec.get("trust_file") or "",
             spec.get("ssh_config_file") or "", *TRUST_FILES]
    out = []
    for path in paths:
        try:
            st = os.stat(os.path.expanduser(path)) if path else None
            out.append(None if st is None else [st.st_mtime_ns, st.st_size, st.st_ino])
        except OSError:
            out.append(None)
    return out


READY_WAIT = 120.0  # s a request waits for the readying of its connection (a login's retries, an agent's start)
REFUSAL_FRESH = 30.0  # s a readying's refusal answers a request; a later command logs in again itself


@dataclass
class Held:
    transport: Any
    spec: dict
    signature: list
    since: float = field(default_factory=time.time)
    last: float = field(default_factory=time.time)
    commands: int = 0
    reopened: int = 0
    said: int = field(init=False)  # the transport's connections told to commands so far (``Keeper._opened``)

    def __post_init__(self) -> None:
        self.said = self.transport.stats.connections  # an adopted one was counted by the command that opened it


class Keeper:
    def __init__(self, path: Path, idle: float, early: bool = False) -> None:
        self.path = path
        self.idle = idle
        self.early = early  # started as a command began (``begin.prespawn``): told nothing, it exits
        self.held: dict[str, Held] = {}
        self.lock = threading.Lock()
        self.active = 0
        self.server: sockets.Server | None = None
        self.started = time.time()
        self.stopping = threading.Event()
        self.readying: dict[str, threading.Event] = {}  # connections ``ready`` is opening, by spec
        self.refused: dict[str, tuple[float, OrchError]] = {}  # what readying one met (when), told to the next
        # request for it: the command that had it readied, which asks at once
        self.residents = Residents()

    # -- the connections ---------------------------------------------------------------------------

    def _held(self, spec: dict, readying: bool = False) -> Held:
        from ..transport.ssh import SshTransport

        key = json.dumps(spec, sort_keys=True)
        if not readying:  # a request: the readying of its connection under way ends first, and its refusal is told
            pending = self.readying.get(key)
            if pending is not None:
                pending.wait(READY_WAIT)
            with self.lock:
                refused = self.refused.pop(key, None)
            if refused is not None and time.monotonic() - refused[0] < REFUSAL_FRESH:
                raise refused[1]
        now = trust_signature(spec)
        with self.lock:
            held = self.held.get(key)
            if held is not None and held.signature != now:  # known_hosts or the SSH config changed: check again
                self.residents.forget(held.transport)
                held.transport.close()
                held = None
            if held is None:
                held = self.held[key] = Held(SshTransport(**spec), spec, now)
            held.last = time.time()
            held.commands += 1
            return held

    def _run(self, held: Held, request: dict, stdin: Iterator[bytes], output: Any, cancel: threading.Event) -> Any:
        from ..transport.ssh import NotStartedError

        for attempt in (1, 2):
            try:
                result = held.transport.run(request["argv"], input=stdin, timeout=request.get("timeout"),
                                            stall=request.get("stall"), output=output, cancel=cancel)
                break
            except NotStartedError:  # the held connection had died: the command never started
                if attempt == 2:
                    raise
                held.reopened += 1
        return result, self._opened(held)

    def _opened(self, held: Held) -> int:
        """The connections opened to ``held``'s target since a command was last told: what a request reports as
        its own. The one readied for the command that started this keeper (``ready``) is that command's, told with
        its first request whether the readying or the request opened it."""
        with self.lock:
            now = held.transport.stats.connections
            new, held.said = now - held.said, now
        return new

    # -- serving ---------------------------------------------------------------------------------------

    def handle(self, conn: socket.socket) -> None:
        with self.lock:
            self.active += 1
        try:
            kind, body = wire.recv(conn)
            request = json.loads(body) if kind == b"H" else {}
            wire.send(conn, b"A")  # taken: from here on the request runs
            try:
                self._answer(conn, request)
            except OrchError as exc:
                wire.send_json(conn, b"F", {"cls": type(exc).__name__, "message": exc.message, "hint": exc.hint,
                                            "detail": exc.detail})
            except (wire.Closed, OSError):
                raise
            except Exception as exc:  # a bug in the keeper: the command gets one clear line
                wire.send_json(conn, b"F", {"cls": "TransportError", "message": f"the connection keeper failed: "
                                            f"{exc!r}"[:300], "hint": "rerun with [ssh] persist = 0, and report it"})
        except (wire.Closed, OSError, ValueError):
            pass
        finally:
            conn.close()
            if self.server is not None:
                self.server.touch()  # before it counts as done: the idle clock starts from its end
            with self.lock:
                self.active -= 1

    def _answer(self, conn: socket.socket, request: dict) -> None:
        op = request.get("op")
        if op == "list":
            wire.send_json(conn, b"R", {"pid": os.getpid(), "since": self.started, "idle": self.idle,
                                        "connections": self.describe()})
        elif op == "close":
            closed = self.close(request.get("match"))
            wire.send_json(conn, b"R", {"pid": os.getpid(), "closed": closed})
            if request.get("exit"):
                self.stopping.set()
                if self.server is not None:
                    self.server.wake()
        elif op == "run":
            self._serve_run(conn, request)
        elif op == "agent":
            self._serve_agent(conn, request)
        elif op == "put":
            data = b"".join(_stdin(conn, None))
            held = self._held(request["spec"])
            held.transport.put(data, request["path"], int(request["mode"]))
            wire.send_json(conn, b"R", {"connections": self._opened(held)})
        else:
            raise TransportError(f"the connection keeper does not know the request {op!r}",
                                 hint="set [ssh] persist = 0, or close the keeper: orch connections close")

    def _serve_run(self, conn: socket.socket, request: dict, stdin: Iterator[bytes] | None = None,
                   cancel: threading.Event | None = None) -> None:
        held = self._held(request["spec"])
        cancel = cancel or threading.Event()
        stream = bool(request.get("stream"))
        output = (lambda chunk: wire.send(conn, b"O", chunk)) if stream else None
        result, opened = self._run(held, request, stdin if stdin is not None else _stdin(conn, cancel), output, cancel)
        for start in range(0, len(result.stdout), 1 << 20):
            wire.send(conn, b"O", memoryview(result.stdout)[start:start + (1 << 20)])
        wire.send_json(conn, b"R", {"exit_code": result.exit_code, "connections": opened,
                                    "stderr": base64.b64encode(result.stderr).decode()})

    def _serve_agent(self, conn: socket.socket, request: dict) -> None:
        """An agent call on a resident agent; one-shot when none serves there."""
        held = self._held(request["spec"])
        cancel = threading.Event()
        out = bytearray()
        stream = bool(request.get("stream"))
        output = (lambda chunk: wire.send(conn, b"O", chunk)) if stream else out.extend
        rest = on_resident(self.residents, held.transport, request["argv"], _stdin(conn, cancel), output,
                           request.get("timeout"), request.get("stall"), cancel)
        if rest is not None:  # the same request one-shot, which pushes the agent again if it is gone
            return self._serve_run(conn, request, rest, cancel)
        for start in range(0, len(out), 1 << 20):
            wire.send(conn, b"O", memoryview(out)[start:start + (1 << 20)])
        wire.send_json(conn, b"R", {"exit_code": 0, "stderr": "", "resident": True,
                                    "connections": self._opened(held)})
        return None

    def describe(self) -> list[dict]:
        with self.lock:
            items = list(self.held.values())
        out = []
        for held in items:
            t = held.transport
            alive = t.alive()
            out.append({"target": t.description, "role": held.spec.get("role"), "alive": alive,
                        "since": held.since, "last": held.last, "commands": held.commands,
                        "connections": t.stats.connections, "reopened": held.reopened,
                        "local_port": t.local_port() if alive else None, "agents": self.residents.names(t)})
        return out

    def close(self, match: str | None) -> int:
        with self.lock:
            keys = [k for k, h in self.held.items() if not match or match in h.transport.description
                    or match == h.spec.get("host")]
            dropped = [self.held.pop(k) for k in keys]
        for held in dropped:
            self.residents.forget(held.transport)
            held.transport.close()
        return len(dropped)

    def ready(self, spec: dict, agent: list[str] | None) -> None:
        """Open the connection ``spec`` names and start a resident agent ``agent`` there, waiting idle: what the
        command that started this keeper used (told once that command reached its target), so that the next
        command finds both up."""
        key, done = json.dumps(spec, sort_keys=True), threading.Event()
        with self.lock:
            self.readying[key] = done
        try:
            held = self._held(spec, readying=True)
            held.commands -= 1  # readied, not used
            if agent:
                self.residents.prestart(held.transport, list(agent))
            else:
                held.transport.connect()
        except OrchError as exc:  # the command's request says it, where it would log in as often again
            with self.lock:
                self.refused[key] = (time.monotonic(), exc)
        except Exception:  # noqa: BLE001 (the next command opens it itself and says what fails)
            pass
        finally:
            with self.lock:
                self.readying.pop(key, None)
            done.set()

    def told(self, stdin) -> None:
        """What the command that started this keeper tells it on its standard input: one line, the connection
        and agent to ready (``client.ready``); nothing (the pipe closed) when that command never reached them.
        Readying counts as use: the keeper does not exit idle meanwhile, and its idle clock starts from its end
        (not from the keeper's start, which a slow first command may outlast)."""
        if self.early:  # the connection it is about to be told: paramiko loads while the command still starts
            from ..transport import ssh, sshlib  # noqa: F401

            sshlib.paramiko()  # ssh.py loads it only as it connects: after the tell, on the login's path
        try:
            line = stdin.readline()
            asked = json.loads(line) if line.strip() else None
        except (OSError, ValueError):
            asked = None
        if not (isinstance(asked, dict) and isinstance(asked.get("spec"), dict)):
            if self.early and not self.held:  # nothing to hold: no command's connection waits for it
                self.stopping.set()
                if self.server is not None:
                    self.server.wake()
            return
        if isinstance(asked.get("idle"), (int, float)):
            self.idle = float(asked["idle"])  # [ssh] persist, read by the command after it started this keeper
        with self.lock:
            self.active += 1
        try:
            self.ready(asked["spec"], asked.get("agent"))
        finally:
            if self.server is not None:
                self.server.touch()
            with self.lock:
                self.active -= 1

    def adopt(self, spec: dict, transport: Any, residents: Residents, signature: list) -> bool:
        """Hold ``transport`` (an orch command's own connection to ``spec``, opened and checked when the trust files
        looked like ``signature``) and its idle resident agents, as if this keeper had opened them; False (nothing
        taken) when it is not alive or one to ``spec`` is held already."""
        key = json.dumps(spec, sort_keys=True)
        with self.lock:
            if key in self.held or not transport.alive():
                return False
            self.held[key] = Held(transport, spec, signature)
        with residents.lock:
            pool = residents.pools.pop(id(transport), [])
        with self.residents.lock:
            self.residents.pools[id(transport)] = pool
        return True

    def listen(self) -> bool:
        """Take the socket and listen on it (connections wait there until ``serve``); False when another keeper
        took it a moment ago."""
        if self.server is not None:
            return True
        server = sockets.Server(self.path)
        if not server.claim():
            return False
        try:
            server.bind()
        except BaseException:
            server.close()
            raise
        self.server = server
        return True

    def serve(self, stdin=None) -> int:
        if not self.listen():
            return 0  # another keeper took this socket a moment ago
        server = self.server
        assert server is not None
        try:
            if stdin is not None:
                threading.Thread(target=self.told, args=(stdin,), daemon=True).start()
            for conn in server.connections(lambda: self.idle, busy=lambda: self.active > 0, stop=self.stopping):
                threading.Thread(target=self.handle, args=(conn,), daemon=True).start()
        finally:
            server.close()
            self.close(None)
        return 0


def _stdin(conn: socket.socket, cancel: threading.Event | None) -> Iterator[bytes]:
    """The command's stdin as the client sends it; once it ends, a watcher cancels the command when the
    client goes away (nothing more is read from it)."""
    while True:
        try:
            kind, body = wire.recv(conn)
        except (wire.Closed, OSError):
            if cancel is not None:
                cancel.set()
            raise TransportError("the orch command went away while sending", hint="") from None
        if kind == b"I":
            yield body
        elif kind == b"E":
            break
    if cancel is not None:
        threading.Thread(target=_watch, args=(conn, cancel), daemon=True).start()


def _watch(conn: socket.socket, cancel: threading.Event) -> None:
    try:
        while conn.recv(1024):
            pass
    except OSError:
        pass
    cancel.set()


def main(argv: list[str]) -> int:
    import logging

    import sys

    path, idle = Path(argv[0]), float(argv[1])
    logging.getLogger("paramiko").addHandler(logging.NullHandler())
    return Keeper(path, idle, early=argv[2:] == ["early"]).serve(sys.stdin.buffer)

