"""A job's logs: every node's log merged line by line, each line prefixed with its node rank.

Each node is followed on its own connection by ``logs.follow`` (byte offsets, reconnects, rotation),
so a dropped connection to one node loses and repeats nothing there and does not stall the others::

    node 0 --follow--> [0] step=10 loss=...
    node 1 --follow--> [1] step=10 loss=...     one writer: whole lines only, never interleaved
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

from ..config import Settings
from ..errors import OrchError
from ..reach.targets import Target


@dataclass
class _Lines:
    """Whole lines of one node, prefixed, written under the shared lock."""

    prefix: bytes
    write: Callable[[bytes], None]
    lock: threading.Lock
    pending: bytes = b""

    def __call__(self, data: bytes) -> None:
        data = self.pending + data
        cut = data.rfind(b"\n") + 1
        self.pending = data[cut:]
        if cut:
            self._out(data[:cut])

    def flush(self) -> None:
        if self.pending:
            self._out(self.pending + b"\n")
            self.pending = b""

    def _out(self, data: bytes) -> None:
        if self.prefix:
            data = b"".join(self.prefix + line for line in data.splitlines(keepends=True))
        with self.lock:
            self.write(data)


@dataclass
class NodeFollow:
    rank: int
    target: Target
    state: dict = field(default_factory=dict)
    error: OrchError | None = None
    reconnects: int = 0


def follow_nodes(settings: Settings, targets: dict[int, Target], exp_id: int, *, write: Callable[[bytes], None],
                 notice: Callable[[str], None], follow: bool, tail_lines: int | None, registry: str | None,
                 prefix: bool = True, folders: bool = False, **kw: object) -> list[NodeFollow]:
    """Print (and with ``follow``, keep printing until every node's run has ended) the logs of ``targets``
    (rank -> target). A node that cannot be read is reported and the others go on; its error is kept.
    ``folders``: the ranks are nodes of one run on one target (a Slurm job over several nodes: each node's log
    is in a folder of the run folder on the shared file system, read through the login node)."""
    from .follow import follow as follow_one

    lock = threading.Lock()
    nodes = [NodeFollow(rank, tgt) for rank, tgt in sorted(targets.items())]

    held: dict[int, list[bytes]] = {n.rank: [] for n in nodes}

    def one(node: NodeFollow) -> None:
        out = write if follow else held[node.rank].append  # a tail is held and written whole, node by node
        lines = _Lines(f"[{node.rank}] ".encode() if prefix else b"", out, lock)
        try:
            res = follow_one(settings, node.target, exp_id, write=lines,
                             notice=lambda m: notice(f"node {node.rank}: {m}"), follow=follow,
                             tail_lines=tail_lines, registry=registry,  # type: ignore[arg-type]
                             **({"node": node.rank} if folders else {}), **kw)
            node.state, node.reconnects = res.state, res.reconnects
        except OrchError as exc:
            node.error = exc
            notice(f"node {node.rank} ({node.target.label}): {exc.message}")
        finally:
            lines.flush()

    threads = [threading.Thread(target=one, args=(n,), name=f"follow-node-{n.rank}", daemon=True) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():  # a timed join keeps Ctrl-C deliverable to this thread
            t.join(0.2)
    for node in nodes if not follow else []:  # every node read at once, each node's tail kept together
        write(b"".join(held[node.rank]))
    return nodes
