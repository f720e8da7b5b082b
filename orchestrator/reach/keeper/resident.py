"""Resident agents: ``agent.pyz serve`` on a held connection, answering one request after another.

    pool = Residents()
    served = pool.call(held_transport, ["python3", ".../agent-<hash>.pyz"], stdin, output, limit, stall, cancel)
    rest = on_resident(pool, held_transport, argv, stdin, output, limit, stall, cancel)  # None: answered

``call`` returns False when no resident could be started there (the agent file is missing, python refuses):
the caller then runs the request as a one-shot command, which reports why as it always has; ``on_resident``
hands back the request's whole stdin for that run. The keeper keeps a pool for the connections it holds; a
command that found no keeper keeps one for its own connection, so its second agent call skips the agent's
start-up on the target. A request that times out, stalls, or is abandoned by its orch command hangs up its
resident's channel: the agent notices like a one-shot call would (no further step starts) and exits, and the next
request starts a new one.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterator

from ...errors import OrchError, TransportError, TransportTimeout
from ..transport.base import pieces

MAX_PER_TARGET = 3  # residents per connection and agent version; more requests at once run one-shot
HELLO = b'{"v":1,"root":"","ops":[],"lock":null,"payload":0}\n'


class _Gone(Exception):
    """The resident's channel closed before its answer ended."""


class Stale(Exception):
    """The resident's own files changed on the target (``agent.serving.serve``): it ran nothing and exited."""


class Resident:
    def __init__(self, transport: Any, argv: list[str]) -> None:
        self.transport = transport
        self.argv = argv
        self.chan = transport.open_channel([*argv, "serve"])
        self.chan.settimeout(0.25)
        self.buf = bytearray()
        self.busy = True

    def alive(self) -> bool:
        return not self.chan.closed and not self.chan.exit_status_ready()

    def close(self) -> None:
        try:
            self.chan.close()
        except Exception:  # noqa: BLE001 (paramiko says the close to a connection that is gone: nothing to hang up)
            pass

    def _answer(self, output: Callable[[bytes], None], limit: float | None, stall: float | None,
                cancel: threading.Event | None, what: str, sent: list[float]) -> None:
        """Read chunks until the end chunk, handing each chunk's bytes to ``output``.

        While the agent is silent the connection is probed every ``keepalive`` seconds (as a one-shot command's
        is), and after four missed intervals it is taken for lost: a link cut without a reset is not waited on.
        """
        progressed = time.monotonic()
        deadline = None if limit is None else progressed + limit
        keepalive = float(getattr(self.transport, "keepalive", 0) or 0)
        heard = [progressed]
        prober: threading.Thread | None = None
        while True:
            while (eol := self.buf.find(b"\n")) >= 0:
                if self.buf[:eol] == b"stale":
                    raise Stale()
                try:
                    size = int(self.buf[:eol], 16)
                except ValueError:
                    raise _Gone() from None  # not chunked: the bootstrap refused before serving
                if len(self.buf) < eol + 1 + size:
                    break
                data = bytes(self.buf[eol + 1:eol + 1 + size])
                del self.buf[:eol + 1 + size]
                if size == 0:
                    return
                output(data)
            now = time.monotonic()
            if cancel is not None and cancel.is_set():
                raise TransportError(f"{what} was abandoned by the orch command that ran it", hint="")
            if deadline is not None and now >= deadline:
                raise TransportTimeout(f"{what} did not finish within {limit:g} s on {self.transport.description}",
                                       hint="it may still be running there; raise the timeout if the target is "
                                            "just slow")
            if stall is not None and now - max(progressed, sent[0]) >= stall:
                raise TransportTimeout(f"{what} made no progress for {stall:g} s on {self.transport.description}",
                                       hint="check the target's disk and the link; raise [ssh] command_timeout "
                                            "if it is just slow")
            silent = now - max(heard[0], sent[0])  # a send that went through: the far side takes data
            if keepalive and silent > 4 * keepalive:
                self.transport.close()  # the next request connects afresh
                raise TransportError(f"connection to {self.transport.description} lost while {what} ran (no "
                                     f"answer to keepalives for {silent:.0f} s); the request may or may not have "
                                     "run", hint="check the target's state before running it again")
            if keepalive and silent > keepalive and (prober is None or not prober.is_alive()):
                prober = threading.Thread(target=self._probe, args=(heard,), daemon=True)
                prober.start()
            try:
                chunk = self.chan.recv(1 << 20)
            except TimeoutError:
                if not self.chan.get_transport().is_active():
                    raise _Gone() from None
                continue
            except (EOFError, OSError):  # paramiko's window adjust, sent from recv, met a dead connection
                raise _Gone() from None
            if not chunk:
                raise _Gone()
            progressed = heard[0] = time.monotonic()
            self.buf += chunk

    def _send_all(self, data: bytes | memoryview) -> None:
        """``sendall`` that waits out a shut window: the channel's short timeout (there for the reads) also
        bounds a send, and on a slow or lossy link the window stays shut longer than that. How long a request
        may go without progress is the reader's stall limit, not this."""
        view = memoryview(data)
        while view:
            if self.chan.closed:
                raise EOFError("the channel closed")
            try:
                view = view[self.chan.send(view):]
            except TimeoutError:
                continue

    def _probe(self, heard: list[float]) -> None:
        transport = self.chan.get_transport()
        try:
            answered = transport.global_request("keepalive@openssh.com", wait=True) is not None
        except Exception:
            return
        if answered or transport.is_active():
            heard[0] = time.monotonic()

    def call(self, stdin: Iterator[bytes] | bytes, output: Callable[[bytes], None], limit: float | None,
             stall: float | None, cancel: threading.Event | None, what: str) -> None:
        failed: list[BaseException] = []
        sent = [time.monotonic()]

        def feed() -> None:
            try:
                for piece in pieces(stdin):
                    self._send_all(piece)
                    sent[0] = time.monotonic()
            except OrchError as exc:
                failed.append(exc)
                self.close()
            except Exception:
                return

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        try:
            self._answer(output, limit, stall, cancel, what, sent)
        except Stale:
            self.close()
            feeder.join(30)  # its next send fails: the caller may read the rest of stdin itself
            raise
        except BaseException:
            self.close()  # hang up: the agent starts no further step, and exits
            if failed:
                raise failed[0] from None
            raise
        feeder.join()


class Residents:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pools: dict[int, list[Resident]] = {}
        self.readying: dict[tuple[int, tuple[str, ...]], threading.Event] = {}  # ``prestart``s under way
        self.starting: dict[tuple[int, tuple[str, ...]], int] = {}  # requests' own starts under way

    def _take(self, transport: Any, argv: list[str], limit: float | None) -> Resident | None:
        with self.lock:
            readying = self.readying.get((id(transport), tuple(argv)))
        if readying is not None:  # one being readied for this very request: sooner up than a second one
            readying.wait(limit if limit is not None else transport.answer_timeout * 3)
        with self.lock:
            pool = self.pools.setdefault(id(transport), [])
            for old in [r for r in pool if r.argv != argv or not r.alive()]:
                if old.busy and old.argv == argv:
                    continue
                old.close()  # another agent version, or dead
                pool.remove(old)
            for resident in pool:
                if not resident.busy:
                    resident.busy = True
                    return resident
            if len(pool) >= MAX_PER_TARGET:
                return None
            key = (id(transport), tuple(argv))
            self.starting[key] = self.starting.get(key, 0) + 1  # a ``prestart`` meanwhile starts no second one
        try:
            resident = self._start(transport, argv, limit)
            if resident is not None:
                with self.lock:
                    self.pools.setdefault(id(transport), []).append(resident)
        finally:
            with self.lock:
                self.starting[key] -= 1
                if not self.starting[key]:
                    del self.starting[key]
        return resident

    @staticmethod
    def _start(transport: Any, argv: list[str], limit: float | None) -> Resident | None:
        """A new resident, checked with an empty request; None when it does not serve (it exited: the agent
        file is missing, its python refuses). A target that does not answer in time is a timeout, as for a
        one-shot call: trying one-shot as well would only wait again."""
        from ..transport.ssh import NotStartedError

        wait = limit if limit is not None else transport.answer_timeout * 3  # as long as the request may take
        try:
            resident = Resident(transport, argv)
        except NotStartedError:  # the held connection had died: one-shot, which reopens it
            return None
        except OrchError:
            raise
        except Exception:
            return None
        try:
            resident.call(HELLO, lambda _data: None, wait, None, None, argv[0])
        except (_Gone, OrchError) as exc:
            resident.close()
            if isinstance(exc, TransportTimeout):
                raise
            return None
        return resident

    def call(self, transport: Any, argv: list[str], stdin: Any, output: Callable[[bytes], None],
             limit: float | None, stall: float | None, cancel: threading.Event | None) -> bool:
        """Run one request on a resident; False when none serves here (run it one-shot instead).

        Raises ``Stale`` when the resident found its files changed and ran nothing: the caller runs the
        request one-shot (which pushes the agent again where it is missing)."""
        resident = self._take(transport, argv, limit if limit is not None else stall)
        if resident is None:
            return False
        try:
            resident.call(stdin, output, limit, stall, cancel, argv[0])
        except Stale:
            with self.lock:
                pool = self.pools.get(id(transport), [])
                if resident in pool:
                    pool.remove(resident)
            raise
        except _Gone:
            if not transport.alive():  # the connection went, not just the agent: as a one-shot command says it
                transport.close()  # the next request connects afresh
                raise TransportError(f"connection to {transport.description} lost while {argv[0]} ran; the request "
                                     "may or may not have run", hint="check the target's state before running it "
                                     "again") from None
            raise TransportError(f"the agent on {transport.description} went away while it answered; the request "
                                 "may or may not have run", hint="check the target's state before running it again"
                                 ) from None
        finally:
            resident.busy = False
        return True

    def prestart(self, transport: Any, argv: list[str]) -> None:
        """A resident ``argv`` waiting idle on ``transport``, unless one already lives there; a request for it
        meanwhile waits for this one rather than start another."""
        key, done = (id(transport), tuple(argv)), threading.Event()
        with self.lock:
            if key in self.readying or key in self.starting or \
                    any(r.argv == argv and r.alive() for r in self.pools.get(id(transport), [])):
                return
            self.readying[key] = done
        try:
            resident = self._start(transport, argv, None)
            if resident is not None:
                resident.busy = False
                with self.lock:
                    self.pools.setdefault(id(transport), []).append(resident)
        finally:
            with self.lock:
                self.readying.pop(key, None)
            done.set()

    def names(self, transport: Any) -> list[str]:
        """The agent file each live resident on ``transport`` runs."""
        with self.lock:
            return [r.argv[-1].rsplit("/", 1)[-1] for r in self.pools.get(id(transport), []) if r.alive()]

    def forget(self, transport: Any) -> None:
        with self.lock:
            pool = self.pools.pop(id(transport), [])
        for resident in pool:
            resident.close()


class Replay:
    """A command's stdin that can be read once more from the start (what a request sends is small; a big push
    is not kept, and then cannot be replayed)."""

    LIMIT = 1 << 20

    def __init__(self, source: Iterator[bytes]) -> None:
        self.source = source
        self.kept: list[bytes] | None = []
        self.size = 0
        self.started = False

    def _keep(self, piece: bytes) -> None:
        if self.kept is not None:
            self.size += len(piece)
            if self.size <= self.LIMIT:
                self.kept.append(bytes(piece))
            else:
                self.kept = None

    def __iter__(self) -> Iterator[bytes]:
        self.started = True
        for piece in self.source:
            self._keep(piece)
            yield piece

    def again(self) -> Iterator[bytes]:
        """Everything the command sends, from the start: what was read already and the rest."""
        if not self.started:
            return self.source  # nothing read yet: streamed as it comes
        for piece in self.source:
            self._keep(piece)
        if self.kept is None:
            raise TransportError("the agent's files on the target changed while a large request was sent to it; "
                                 "nothing was run", hint="run the command again")
        return iter(self.kept)


def on_resident(pool: Residents, transport: Any, argv: list[str], stdin: Iterator[bytes],
                output: Callable[[bytes], None], limit: float | None, stall: float | None,
                cancel: threading.Event | None) -> Iterator[bytes] | None:
    """Run an agent request on a resident of ``pool``; None once it answered, else the request's stdin from its
    start for a one-shot run (none serves there, or the one that took it found its files changed and ran
    nothing)."""
    replay = Replay(stdin)
    try:
        served = pool.call(transport, argv, replay, output, limit, stall, cancel)
    except Stale:
        return replay.again()
    return None if served else replay.again()
