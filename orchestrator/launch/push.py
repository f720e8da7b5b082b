"""Sending a revision's missing blobs: streamed from the files in pieces, resumable, its progress counted.

Memory stays bounded whatever the tree's size: each file is read 1 MiB at a time while the channel
takes it, and the agent writes each piece to disk as it arrives. The call is limited by progress
(no byte moved for ``command_timeout`` seconds), not by its total time. Blobs a cut push left half
sent on the target resume from where they stopped.
"""

from __future__ import annotations

import os
from typing import Iterator

from ..errors import InputError
from ..reach.agent_client import AgentClient, Op, Stream
from ..reach.transport.base import FileRange
from .meter import Count, Meter, silent
from .revisions import Revision

CHUNK = 1 << 20
INLINE = 256 << 10  # a push this small rides in the launch's locked call: one round trip (and agent start) less
#: a push this big goes the bulk way (``Transport.run_bulk``: OpenSSH where it can, ~1.7x paramiko's rate); a
#: smaller one stays on the connection already open, which saves the new connection's ~0.1-0.2 s
BULK = 64 << 20


def plan(rev: Revision, missing: list[str], partial: dict) -> list[dict]:
    """What to send: one entry per missing blob, from the offset the target already holds."""
    by_sha = {f["sha256"]: f for f in rev.files}
    out = []
    for sha in dict.fromkeys(missing):
        size = int(by_sha[sha]["size"])
        offset = int(partial.get(sha) or 0)
        out.append({"sha256": sha, "size": size, "offset": offset if 0 <= offset <= size else 0})
    return out


def _pieces(rev: Revision, entries: list[dict], bar: Count) -> Iterator[FileRange]:
    """Each blob's bytes as 1 MiB ranges of its open file: read by the transport, or spliced into ssh unread."""
    paths = {f["sha256"]: f["path"] for f in rev.files}
    for entry in entries:
        rel = paths[entry["sha256"]]
        at, end = entry["offset"], entry["size"]
        try:
            fd = os.open(rev.local_paths[rel], os.O_RDONLY)
        except OSError as exc:
            raise InputError(f"cannot read {rel}: {exc.strerror}", hint="check the file and deploy again") from None
        try:
            while at < end:
                n = min(CHUNK, end - at)
                yield FileRange(fd, at, n, rel)
                at += n
                bar.advance(n)
        finally:
            os.close(fd)
        bar.advance(0, files=1)


def send(client: AgentClient, rev: Revision, probe_missing: dict, *, meter: Meter | None = None,
         stall: float) -> dict:
    """Store the blobs the target lacks, counting the bytes on ``meter``; what was sent (files, bytes, resumed)."""
    entries = plan(rev, probe_missing.get("missing", []), probe_missing.get("partial") or {})
    total = sum(e["size"] - e["offset"] for e in entries)
    sent = {"files": len(rev.files), "missing": len(entries), "bytes": total,
            "resumed_bytes": sum(e["offset"] for e in entries)}
    if not entries:
        return sent
    with (meter or silent)("pushing", total, len(entries)) as bar:
        client.call([Op("blobs_store", {"blobs": entries})], what="push", timeout=stall,
                    payload=Stream(total, lambda: _pieces(rev, entries, bar)), bulk=total >= BULK)
    over = client.transport.stats.extra.get("bulk") if total >= BULK else None
    return sent | ({"over": over} if over else {})


def inline(rev: Revision, probe_missing: dict) -> tuple[Op, bytes, dict] | None:
    """The ``blobs_store`` op and its payload for a push of at most ``INLINE`` bytes (read now, whole), and what it
    sends; None when nothing is missing or it is bigger (``send`` streams it in a call of its own)."""
    entries = plan(rev, probe_missing.get("missing", []), probe_missing.get("partial") or {})
    total = sum(e["size"] - e["offset"] for e in entries)
    if not entries or total > INLINE:
        return None
    sent = {"files": len(rev.files), "missing": len(entries), "bytes": total,
            "resumed_bytes": sum(e["offset"] for e in entries)}
    with silent("pushing", total, len(entries)) as bar:
        data = b"".join(piece.read() for piece in _pieces(rev, entries, bar))
    return Op("blobs_store", {"blobs": entries}), data, sent
