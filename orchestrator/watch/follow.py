"""Following a run's log by byte offset, across dropped connections.

The agent returns bytes from an offset plus the log's identity (device:inode). The follower keeps
the offset, so after a reconnect it asks for exactly the next byte: no line lost, none repeated.
A changed identity or a shorter file means rotation/truncation: start over and say so. A log that
was truncated and has already grown past the offset again is caught by re-reading the last few
bytes before the offset (``overlap``) and checking they are still the ones printed.

While following, a partial last line is held back until its newline arrives (or the run ends), so
the output never shows half a line that a later read completes.

Once caught up, a follower on a transport that streams asks the agent to stream (``log_stream``):
one agent process writes the appended bytes as frames as soon as they are written, and ends when the
run has ended and everything is out, or when the log is no longer the one being followed. Each frame
advances the offset exactly as a read would, so a drop mid-stream resumes at the last whole frame;
whatever ended the stream (rotation, truncation, the run's end) is then handled by an ordinary read.
Without streaming (or with ``STREAMING`` off), the follower reads every ``poll`` seconds. A ``cancel`` event
(a reader that stopped looking: ``orch ui``) ends the follow at the next frame, heartbeat or poll.
"""

from __future__ import annotations

import base64
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..reach.agent_client import AgentClient, Op, decode_log
from ..config import Settings
from ..errors import InputError, TransportError
from ..records.experiments import ENDED
from ..reach.targets import Target

OVERLAP = 16
STREAMING = True  # off: poll with log_read only (what a transport that cannot stream does)
STREAM_POLL = 0.05  # s between the agent's looks at the log while streaming
HEARTBEAT = 2.0  # s of silence after which the agent sends an empty frame


class _Cancelled(Exception):
    """The follower's ``cancel`` was set: it stops where it is."""


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

    @property
    def streams(self) -> bool:
        """Whether this link can stream: its transport says so, and its ``run`` (maybe a subclass's) takes output."""
        if not STREAMING or self.client is None or not self.client.transport.streams:
            return False
        import inspect

        return "output" in inspect.signature(self.client.transport.run).parameters

    def stream(self, on_frame: Callable[[dict, bytes], None], **args: object) -> dict:
        assert self.client is not None
        return self.client.call([Op("log_stream", args)], on_frame=on_frame,
                                timeout=self.settings.ssh.command_timeout)[0]

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
           max_bytes: int = 1 << 20, overlap: int = OVERLAP, registry: str | None = None,
           cancel: threading.Event | None = None, whole_lines: bool = True, node: int | None = None) -> FollowResult:
    """Write the log of ``exp_id`` (from its last ``tail_lines`` lines, or all of it); with ``follow``,
    keep going until the run has ended and every byte it wrote has been written out.

    ``max_failures`` bounds consecutive failed attempts, not reconnects over the whole run. ``registry``
    is the registry id in the run folder's name (``Registry.run_registry``). With ``whole_lines=False`` a
    partial last line is written as it comes (a progress bar redrawn in place never ends its line). ``node``: that
    node's log of a Slurm job over several nodes (each in a folder of the one run folder).
    """
    link = _Link(settings, target)
    offset: int | None = None
    identity: str | None = None
    seen = b""  # the last bytes before ``offset``, for the overlap check
    pending = b""  # a partial last line, held back while following
    reconnects = failures = total = reads = resets = taken = 0
    streaming = True
    backoff = first_backoff
    lost = ended = False
    state: dict = {}

    def take(header: dict, data: bytes) -> None:
        """A streamed frame: the bytes right after ``offset`` (the agent checked the log is the same)."""
        nonlocal offset, seen, taken
        if cancel is not None and cancel.is_set():
            raise _Cancelled
        if data:
            seen = (seen + data)[-overlap:]
            emit(data)
        offset, taken = header["offset"], taken + 1

    def link_lost(exc: TransportError) -> None:
        nonlocal failures, lost, reconnects, backoff
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
        pause(backoff)
        backoff = min(max_backoff, backoff * 2)

    def emit(data: bytes, flush: bool = False) -> None:
        nonlocal pending, total
        if follow and whole_lines:
            data = pending + data
            cut = len(data) if flush else data.rfind(b"\n") + 1
            data, pending = data[:cut], data[cut:]
        if data:
            write(data)
            total += len(data)

    def pause(seconds: float) -> None:
        if cancel is None:
            time.sleep(seconds)
        elif cancel.wait(seconds):
            raise _Cancelled

    try:
        while True:
            if cancel is not None and cancel.is_set():
                raise _Cancelled
            back = 0
            args: dict = {"exp_id": exp_id, "registry": registry, "max_bytes": max_bytes, "identity": identity}
            at_node: dict = {"node": node} if node else {}  # node 0's log is the run folder's own
            args.update(at_node)
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
                link_lost(exc)
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
                pause(poll)  # the log was moved away and its successor is not there yet
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
            if streaming and link.streams and identity is not None:
                taken = 0
                try:
                    why = link.stream(take, exp_id=exp_id, registry=registry, offset=offset, identity=identity,
                                      seen=base64.b64encode(seen).decode(), max_bytes=max_bytes,
                                      poll=STREAM_POLL, heartbeat=HEARTBEAT, **at_node)["why"]
                except TransportError as exc:
                    link_lost(exc)
                    continue
                except InputError:  # an agent without log_stream: poll
                    streaming = False
                    continue
                reads += 1
                if why != "ended" and not taken:
                    pause(poll)  # the log changed under the stream: the next read sorts it out
                continue
            pause(poll)
        emit(b"", flush=True)
    except _Cancelled:
        emit(b"", flush=True)
    except KeyboardInterrupt:
        emit(b"", flush=True)
        raise
    finally:
        link.close()
    return FollowResult(offset or 0, state, reconnects, total, reads, resets, link.received, link.sent)
