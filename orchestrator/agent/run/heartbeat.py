"""A job's progress across its nodes, judged on the targets: each node's supervisor tells the others.

A job is stalled only when no node moves. Every second each node's supervisor sends the size of its log
to every other node of the job over UDP, and its stall watchdog counts the job's newest progress (its
own log growing, or a peer's reported size changing) instead of its own log alone::

    orch-hb1 3f2a9c0d1e7b4a65 1 42 18233     # magic, job token, sender's rank, sequence, log size

The token is a hash of the job's id (the rendezvous id and the registry key), so two jobs on one node
never mix; a packet is taken only if it is well formed, carries this job's token and a peer's rank, and
is newer than the last one from that rank. Nothing but those numbers is read from it. A frozen node sends
nothing and its peers block in a collective (their logs stop): they still end as stalled.

No thread: the supervisor's watch loop calls ``Beacon.tick`` between its waits; the socket is
non-blocking, peers are resolved once at the start, and a port that cannot be bound leaves the node
judging its own log alone (said in its log). ``job.json`` in the run folder records what was heard.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..layout import write_json
from .recorded import JOB_STATE as STATE_FILE, job_state as read_state  # (status reads them without this module)

if TYPE_CHECKING:
    import socket

MAGIC = "orch-hb1"
SEND_EVERY = 1.0  # seconds between two heartbeats of a node
SAVE_EVERY = 2.0  # seconds between two writes of job.json (only when something changed)
MAX_PACKET = 96
MAX_DRAIN = 256  # packets read per tick at most: a flood cannot keep the supervisor in the loop
MAX_NODES = 4096
_PACKET = re.compile(rb"orch-hb1 ([0-9a-f]{16}) ([0-9]{1,4}) ([0-9]{1,18}) ([0-9]{1,18})\n?")


@dataclass(frozen=True)
class JobSpec:
    """Who this node is in its job: ``{"id": ..., "rank": 1, "addrs": ["10.0.0.1", "10.0.0.2"], "port": N}``."""

    id: str
    rank: int
    addrs: tuple[str, ...]
    port: int

    @classmethod
    def from_dict(cls, raw: object) -> "JobSpec":
        """Checked as the agent checks every request: a ValueError says what is wrong."""
        if not isinstance(raw, dict) or set(raw) != {"id", "rank", "addrs", "port"}:
            raise ValueError("job must be {id, rank, addrs, port}")
        job, rank, addrs, port = raw["id"], raw["rank"], raw["addrs"], raw["port"]
        if not isinstance(job, str) or not 0 < len(job) <= 300:
            raise ValueError("job id must be a string of 1 to 300 characters")
        if not isinstance(addrs, list) or not 2 <= len(addrs) <= MAX_NODES or \
                not all(isinstance(a, str) and 0 < len(a) <= 255 for a in addrs):
            raise ValueError(f"job addrs must list 2 to {MAX_NODES} addresses")
        if type(rank) is not int or not 0 <= rank < len(addrs):
            raise ValueError("job rank must be the index of this node in addrs")
        if type(port) is not int or not 1 <= port <= 65535:
            raise ValueError("job port must be a UDP port (1 to 65535)")
        return cls(job, rank, tuple(addrs), port)

    @property
    def token(self) -> str:
        return token(self.id)


def token(job_id: str) -> str:
    return hashlib.sha256(job_id.encode()).hexdigest()[:16]


def encode(tok: str, rank: int, seq: int, size: int) -> bytes:
    return f"{MAGIC} {tok} {rank} {seq} {size}\n".encode()


def decode(data: bytes, tok: str, nnodes: int, own_rank: int) -> tuple[int, int, int] | None:
    """``(rank, seq, size)`` of a packet of this job from a peer; None for anything else."""
    if len(data) > MAX_PACKET:
        return None
    m = _PACKET.fullmatch(data)
    if m is None or m.group(1).decode() != tok:
        return None
    rank, seq, size = int(m.group(2)), int(m.group(3)), int(m.group(4))
    if rank >= nnodes or rank == own_rank:
        return None
    return rank, seq, size


@dataclass
class Peer:
    seq: int
    size: int
    heard: float  # time.time() of its newest packet
    moved: float  # time.time() its size last changed (or it was first heard)


@dataclass
class Progress:
    """The progress rule, pure: the job moved when this node's log grew or a peer's size changed.

    ``now`` is a monotonic clock for the stall decision; ``wall`` the wall clock ``job.json`` reports.
    """

    newest: float  # monotonic time of the job's newest progress
    own: int | None = None
    peers: dict[int, Peer] = field(default_factory=dict)
    newest_by: int | None = None  # whose progress it was (None: this node's own log)

    def own_size(self, size: int, now: float) -> bool:
        if size == self.own:
            return False
        self.own, self.newest, self.newest_by = size, now, None
        return True

    def peer(self, rank: int, seq: int, size: int, now: float, wall: float) -> bool:
        """Take a peer's heartbeat; True when it is progress. An older or repeated packet is ignored."""
        old = self.peers.get(rank)
        if old is not None and seq <= old.seq:
            return False
        moved = old is None or size != old.size
        self.peers[rank] = Peer(seq, size, wall, wall if moved else old.moved)  # type: ignore[union-attr]
        if moved:
            self.newest, self.newest_by = now, rank
        return moved

    def touch(self, now: float) -> None:
        """Something other than the log says the run is alive (it is being stopped)."""
        self.newest = now

    def stalled(self, now: float, timeout: float) -> bool:
        return now - self.newest >= timeout


class Beacon:
    """The UDP side of one node's supervisor: send its log size to the peers, read theirs."""

    def __init__(self, spec: JobSpec, run_dir: str) -> None:
        self.spec, self.run_dir = spec, run_dir
        self.token = spec.token
        self.seq = 0
        self.sock: socket.socket | None = None
        self.error: str | None = None
        self.targets: list[tuple[str, int]] = []
        self.unresolved: list[int] = []
        self.last_send = float("-inf")
        self.last_save = float("-inf")
        self.dirty = True
        self.dropped = 0

    def open(self) -> "Beacon":
        """Bind the job's port and resolve the peers once; on failure ``error`` says why (nothing raises)."""
        import socket  # here, not at the top: every status reads a node's state from this module, once a call

        for rank, addr in enumerate(self.spec.addrs):
            if rank == self.spec.rank:
                continue
            try:
                found = socket.getaddrinfo(addr, self.spec.port, socket.AF_INET, socket.SOCK_DGRAM)
                self.targets.append((found[0][4][0], self.spec.port))
            except (OSError, IndexError, UnicodeError):
                self.unresolved.append(rank)
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.setblocking(False)
            try:
                sock.bind(("", self.spec.port))
            except OSError:
                sock.close()
                raise
            self.sock = sock
        except OSError as exc:
            self.error = f"cannot listen on UDP port {self.spec.port}: {exc.strerror or exc}"
        return self

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def tick(self, size: int, progress: Progress, now: float) -> None:
        """Read what arrived, send this node's size once a second, save ``job.json`` now and then."""
        wall = time.time()
        for _ in range(MAX_DRAIN if self.sock is not None else 0):
            try:
                data = self.sock.recv(MAX_PACKET + 1)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break  # an ICMP error queued on the socket: nothing to read this time
            got = decode(data, self.token, len(self.spec.addrs), self.spec.rank)
            if got is None:
                self.dropped += 1
                continue
            progress.peer(*got, now, wall)
            self.dirty = True
        if self.sock is not None and now - self.last_send >= SEND_EVERY:
            self.seq += 1
            packet = encode(self.token, self.spec.rank, self.seq, size)
            for dest in self.targets:
                try:
                    self.sock.sendto(packet, dest)
                except OSError:
                    pass  # unreachable or a full buffer: the next second tries again
            self.last_send = now
        if self.dirty and now - self.last_save >= SAVE_EVERY:
            self.save(progress, wall, now)

    def save(self, progress: Progress, wall: float, now: float) -> None:
        state = {"rank": self.spec.rank, "port": self.spec.port, "error": self.error,
                 "unresolved": self.unresolved, "dropped": self.dropped,
                 "newest": wall - (now - progress.newest), "newest_by": progress.newest_by,
                 "peers": {str(r): {"heard": p.heard, "moved": p.moved, "size": p.size, "seq": p.seq}
                           for r, p in sorted(progress.peers.items())}}
        try:
            write_json(os.path.join(self.run_dir, STATE_FILE), state)
        except OSError:
            return  # a full disk: the watchdog goes on, the report waits
        self.last_save, self.dirty = now, False
