"""Following a run's log by byte offset, across dropped connections.

The agent returns bytes from an offset plus the log's identity (device:inode). The follower keeps
the offset, so after a reconnect it asks for exactly the next byte: no line lost, none repeated.
A changed identity or a shorter file means rotation/truncation: start over and say so. A log that
was truncated and has already grown past the offset again is caught by re-reading the last few
bytes before the offset (``overlap``) and checking they are still the ones printed.

While following, a partial last line is held back until its newline arrives (or the run ends), so
the output never shows half a line that a later read completes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from .agent_client import AgentClient, decode_log
from .config import Settings
from .errors import TransportError
from .experiments import ENDED
from .targets import Target

OVERLAP = 16


@dataclass
class FollowResult:
    offset: int
    state: dict
    reconnects: int
    bytes: int
    reads: int
    resets: int = 0
    received: int = 0
    sent: int = 0


@dataclass
class _Link:
    """The follower's agent connection, made on first use and remade after a transport failure."""

    settings: Settings
    target: Target
    client: AgentClient | None = None
    received: int = 0
    sent: int = 0
    opened: int = 0
    connections: int = 0  # connections the current transport had made at the last read

    def read(self, **args: object) -> dict:
        if self.client is None:
            assert self.target.connect is not None
            transport = self.target.connect()
            self.opened += 1
            self.client = AgentClient(transport, self.target.root, self.target.python,
                                      timeout=self.settings.ssh.command_timeout)
        return self.client.one("log_read", **args)

    def close(self) -> None:
        if self.client is not None:
            transport = self.client.transport
            self.client = None
            self.connections = 0
            self.received += transport.stats.bytes_received
            self.sent += transport.stats.bytes_sent
            transport.close()


def follow(settings: Settings, target: Target, exp_id: int, *, write: Callable[[bytes], None],
           notice: Callable[[str], None], follow: bool = False, tail_lines: int | None = None,
           poll: float = 0.3, first_backoff: float = 0.5, max_backoff: float = 8.0, max_failures: int = 20,
           max_bytes: int = 1 << 20, overlap: int = OVERLAP, registry: str | None = None) -> FollowResult:
    """Write the log of ``exp_id`` (from its last ``tail_lines`` lines, or all of it); with ``follow``,
    keep going until the run has ended and every byte it wrote has been written out.

    ``max_failures`` bounds consecutive failed attempts, not reconnects over the whole run. ``registry``
    is the registry id in the run folder's name (``Registry.run_registry``).
    """
    link = _Link(settings, target)
    offset: int | None = None
    identity: str | None = None
    seen = b""  # the last bytes before ``offset``, for the overlap check
    pending = b""  # a partial last line, held back while following
    reconnects = failures = total = reads = resets = 0
    backoff = first_backoff
    lost = ended = False
    state: dict = {}

    def emit(data: bytes, flush: bool = False) -> None:
        nonlocal pending, total
        if follow:
            data = pending + data
            cut = len(data) if flush else data.rfind(b"\n") + 1
            data, pending = data[:cut], data[cut:]
        if data:
            write(data)
            total += len(data)

    try:
        while True:
            back = 0
            args: dict = {"exp_id": exp_id, "registry": registry, "max_bytes": max_bytes, "identity": identity}
            if offset is None and tail_lines is not None:
                args["tail_lines"] = tail_lines
            else:
                back = min(len(seen), offset or 0) if follow else 0
                args["offset"] = (offset or 0) - back
            try:
                value = link.read(**args)
            except TransportError as exc:
                if not follow:
                    raise
                failures += 1
                if failures > max_failures:
                    raise TransportError(f"gave up following experiment {exp_id} after {max_failures} failed "
                                         f"attempts: {exc.message}",
                                         hint="check the connection, then run orch logs --follow again "
                                              "(the run is not affected)") from exc
                lost = True
                reconnects += 1
                notice(f"connection lost ({exc.message}); reconnecting in {backoff:.1f} s "
                       f"and resuming at byte {offset or 0}")
                link.close()
                time.sleep(backoff)
                backoff = min(max_backoff, backoff * 2)
                continue
            conns = link.client.transport.stats.connections if link.client else 0
            if lost or (link.connections and conns > link.connections):
                # a link that died between two reads is re-made by the transport before the next one
                notice(f"reconnected; resuming at byte {offset or 0}")
                lost = False
            link.connections = conns
            failures, backoff = 0, first_backoff
            reads += 1
            data = decode_log(value)
            if value["identity"] is None and identity is not None and value["state"].get("state") not in ENDED:
                time.sleep(poll)  # the log was moved away and its successor is not there yet
                continue
            if value["reset"] or (back and data[:back] != seen[-back:]):
                resets += 1
                notice("the log was rotated or truncated; starting over from its beginning")
                if pending:
                    emit(b"\n", flush=True)
                seen, ended = b"", False
                if not value["reset"]:  # regrown past our offset: read again from the start
                    offset, identity = 0, value["identity"]
                    continue
            elif back:
                data = data[back:]
            offset, identity, state = value["offset"], value["identity"], value["state"]
            if data:
                seen = (seen + data)[-overlap:]
                emit(data)
                ended = False
            if offset < value["size"]:
                continue
            if not follow:
                break
            if state.get("state") in ENDED:
                if ended:  # a second read after the end found nothing more: the log is complete
                    break
                ended = True
                continue
            time.sleep(poll)
        emit(b"", flush=True)
    except KeyboardInterrupt:
        emit(b"", flush=True)
        raise
    finally:
        link.close()
    return FollowResult(offset or 0, state, reconnects, total, reads, resets, link.received, link.sent)
