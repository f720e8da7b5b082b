"""Following a run's log by byte offset, across dropped connections.

The agent returns bytes from an offset plus the log's identity (device:inode). The follower keeps
the offset, so after a reconnect it asks for exactly the next byte: no line lost, none repeated.
A changed identity or a shorter file means rotation/truncation: start over and say so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from .agent_client import AgentClient, decode_log
from .config import Settings
from .errors import TransportError
from .targets import Target

FINAL_STATES = ("finished", "crashed", "stopped")


@dataclass
class FollowResult:
    offset: int
    state: dict
    reconnects: int
    bytes: int
    reads: int


def follow(settings: Settings, target: Target, exp_id: int, *, write: Callable[[bytes], None],
           notice: Callable[[str], None], follow: bool = False, tail_lines: int | None = None,
           poll: float = 0.3, max_backoff: float = 8.0, max_reconnects: int = 50,
           max_bytes: int = 1 << 20) -> FollowResult:
    assert target.connect is not None
    transport = target.connect()
    client = AgentClient(transport, target.root, target.python, timeout=settings.ssh.command_timeout)
    offset: int | None = None
    identity: str | None = None
    reconnects = total = reads = 0
    backoff = 0.5
    state: dict = {}
    try:
        while True:
            args: dict = {"exp_id": exp_id, "max_bytes": max_bytes, "identity": identity}
            if offset is None and tail_lines is not None:
                args["tail_lines"] = tail_lines
            else:
                args["offset"] = offset or 0
            try:
                value = client.one("log_read", **args)
            except TransportError as exc:
                if not follow or reconnects >= max_reconnects:
                    raise
                reconnects += 1
                notice(f"connection lost ({exc.message}); reconnecting in {backoff:.1f} s "
                       f"and resuming at byte {offset or 0}")
                transport.close()
                time.sleep(backoff)
                backoff = min(max_backoff, backoff * 2)
                transport = target.connect()
                client = AgentClient(transport, target.root, target.python, timeout=settings.ssh.command_timeout)
                continue
            if reconnects and backoff > 0.5:
                notice(f"reconnected; resuming at byte {offset or 0}")
            backoff = 0.5
            reads += 1
            if value["reset"]:
                notice("the log was rotated or truncated; starting over from its beginning")
            data = decode_log(value)
            if data:
                write(data)
                total += len(data)
            offset, identity, state = value["offset"], value["identity"], value["state"]
            at_end = offset >= value["size"]
            if at_end and (not follow or state.get("state") in FINAL_STATES):
                if follow and state.get("state") in FINAL_STATES:
                    # one more read: the run may have written its last bytes after our read
                    again = client.one("log_read", exp_id=exp_id, offset=offset, identity=identity,
                                       max_bytes=max_bytes)
                    extra = decode_log(again)
                    if extra:
                        write(extra)
                        total += len(extra)
                        offset = again["offset"]
                        continue
                return FollowResult(offset, state, reconnects, total, reads)
            if at_end:
                time.sleep(poll)
    finally:
        transport.close()
