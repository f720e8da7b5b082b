"""Sending a revision's missing blobs: streamed from the files in pieces, resumable, its progress counted.

Memory stays bounded whatever the tree's size: each file is read 1 MiB at a time while the channel
takes it, and the agent writes each piece to disk as it arrives. The call is limited by progress
(no byte moved for ``command_timeout`` seconds), not by its total time. Blobs a cut push left half
sent on the target resume from where they stopped.

A pending revision's files (a first push: ``revisions.build(defer=...)``) are hashed while they are sent: a
thread reads each file ahead of the transport and its hash follows the file's bytes, so the target checks
every byte it got against the controller's hash, and the revision's id is known when the push ends.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING, Iterator

from ..errors import InputError
from ..files import sha256_file
from ..reach.agent_client import AgentClient, Op, Stream
from ..reach.transport.base import FileRange, shrank
from .meter import Count, Meter, silent
from .model import Launch, PushRevision
from .revisions import PENDING, Revision

if TYPE_CHECKING:
    from concurrent.futures import Future

CHUNK = 1 << 20
INLINE = 256 << 10  # a push this small rides in the launch's locked call: one round trip (and agent start) less
#: a push this big goes the bulk way (``Transport.run_bulk``: OpenSSH where it can, ~1.7x paramiko's rate); a
#: smaller one stays on the connection already open, which saves the new connection's ~0.1-0.2 s
BULK = 64 << 20
DIGEST = 64  # the hex hash after a pending file's bytes (agent/store/blob_stream.py)


def missing_op(rev: Revision) -> Op:
    """The probe's question: which blobs the target lacks, and for the pending files the bytes a cut push
    kept of each and the stored blobs of their sizes (a file stored before may be one of them)."""
    args: dict = {"hashes": sorted({f["sha256"] for f in rev.files if f["sha256"] is not None})}
    if rev.pending:
        args["keys"] = [f["key"] for f in rev.pending]
        args["sizes"] = sorted({f["size"] for f in rev.pending})
    return Op("blobs_missing", args)


def resolve(client: AgentClient, rev: Revision, found: dict, meter: Meter | None = None) -> dict:
    """The probe's answer once the pending files the target may hold are hashed here and asked about: a file
    whose size matches a stored blob is hashed before the push (it may not need to be sent at all), unless a
    cut push left part of it there (then the rest is sent)."""
    sized, kept = found.get("sized") or {}, found.get("partial_keys") or {}
    maybe = {f["path"] for f in rev.pending if str(f["size"]) in sized and f["key"] not in kept}
    if not maybe:
        return found
    rev.hash_pending(meter, paths=maybe)
    asked = sorted({f["sha256"] for f in rev.files if f["path"] in maybe})
    more = client.one("blobs_missing", hashes=asked)
    return found | {"missing": list(found.get("missing", [])) + more["missing"],
                    "partial": (found.get("partial") or {}) | (more.get("partial") or {})}


def plan(rev: Revision, missing: list[str], partial: dict, partial_keys: dict | None = None) -> list[dict]:
    """What to send: one entry per missing blob (and per pending file, by its key), from the offset the target
    already holds."""
    by_sha = {f["sha256"]: f for f in rev.files}
    out = []
    for sha in dict.fromkeys(missing):
        size = int(by_sha[sha]["size"])
        offset = int(partial.get(sha) or 0)
        out.append({"sha256": sha, "size": size, "offset": offset if 0 <= offset <= size else 0})
    for f in rev.pending:
        size, offset = int(f["size"]), int((partial_keys or {}).get(f["key"]) or 0)
        out.append({"key": f["key"], "size": size, "offset": offset if 0 <= offset <= size else 0})
    return out


def _hash(path: os.PathLike, rel: str, size: int) -> str:
    """The hash of exactly the ``size`` bytes a pending file sends."""
    try:
        return sha256_file(path, size)
    except EOFError:
        raise shrank(rel) from None
    except OSError as exc:
        raise InputError(f"cannot read {rel}: {exc.strerror}", hint="check the file and deploy again") from None


def _pieces(rev: Revision, entries: list[dict], bar: Count, hashes: dict[str, str] | None = None
            ) -> Iterator[FileRange | bytes]:
    """Each blob's bytes as 1 MiB ranges of its open file: read by the transport, or spliced into ssh unread.
    A pending file's hash (of all its bytes, hashed by a thread ahead of the transport) follows its bytes, and
    is kept in ``hashes`` by path."""
    from concurrent.futures import ThreadPoolExecutor

    paths = {f["sha256"]: f["path"] for f in rev.files if f["sha256"] is not None}
    by_key = {f["key"]: f["path"] for f in rev.pending}
    keyed = [e for e in entries if "key" in e]
    pool = ThreadPoolExecutor(1, thread_name_prefix="push-hash") if keyed else None
    ahead: dict[str, Future] = {}
    try:
        for e in keyed:  # hashed in order, each file once, while the ones before it are sent
            rel = by_key[e["key"]]
            ahead[e["key"]] = pool.submit(_hash, rev.local_paths[rel], rel, e["size"])
        for entry in entries:
            yield from _ranges(rev, entry, paths.get(entry.get("sha256")) or by_key[entry.get("key")], bar)
            if "key" in entry:
                sha = ahead[entry["key"]].result()
                if hashes is not None:
                    hashes[by_key[entry["key"]]] = sha
                yield sha.encode()
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _ranges(rev: Revision, entry: dict, rel: str, bar: Count) -> Iterator[FileRange]:
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
    entries = plan(rev, probe_missing.get("missing", []), probe_missing.get("partial") or {},
                   probe_missing.get("partial_keys"))
    total = sum(e["size"] - e["offset"] for e in entries)
    sent = {"files": len(rev.files), "missing": len(entries), "bytes": total,
            "resumed_bytes": sum(e["offset"] for e in entries)}
    if not entries:
        return sent
    hashes: dict[str, str] = {}
    digests = DIGEST * sum("key" in e for e in entries)
    with (meter or silent)("pushing", total, len(entries)) as bar:
        client.call([Op("blobs_store", {"blobs": entries})], what="push", timeout=stall,
                    payload=Stream(total + digests, lambda: _pieces(rev, entries, bar, hashes)), bulk=total >= BULK)
    if rev.pending:
        rev.settle(hashes)
        sent["hashed_while_sent"] = len(hashes)
    over = client.transport.stats.extra.get("bulk") if total >= BULK else None
    return sent | ({"over": over} if over else {})


def inline(rev: Revision, probe_missing: dict) -> tuple[Op, bytes, dict] | None:
    """The ``blobs_store`` op and its payload for a push of at most ``INLINE`` bytes (read now, whole), and what it
    sends; None when nothing is missing or it is bigger (``send`` streams it in a call of its own)."""
    entries = plan(rev, probe_missing.get("missing", []), probe_missing.get("partial") or {})
    total = sum(e["size"] - e["offset"] for e in entries)
    if not entries or total > INLINE or rev.pending:
        return None
    sent = {"files": len(rev.files), "missing": len(entries), "bytes": total,
            "resumed_bytes": sum(e["offset"] for e in entries)}
    with silent("pushing", total, len(entries)) as bar:
        data = b"".join(piece.read() for piece in _pieces(rev, entries, bar))
    return Op("blobs_store", {"blobs": entries}), data, sent


def changed_ahead(rev: Revision) -> tuple[Op, bytes] | None:
    """The ``blobs_store`` op and payload of the files this build hashed (changed since the last one: the blobs a
    target most likely lacks), for a probe to store before it asks what is missing; None when there are none or
    they are more than ``INLINE`` bytes. Storing blobs changes nothing a run or a record sees, so a job's nodes take
    them before its gang check: a one-line change then needs no push call of its own on any node."""
    if not rev.fresh or rev.pending:
        return None
    found = inline(rev, {"missing": sorted({f["sha256"] for f in rev.files if f["path"] in rev.fresh})})
    return (found[0], found[1]) if found is not None else None


def bind(launch: Launch) -> None:
    """Name a pending revision by its id, once its push has hashed it, in the inputs and the plan."""
    rev = launch.revision
    if launch.inputs.revision != PENDING or rev is None or rev.id is None:
        return
    launch.inputs.revision = rev.id
    launch.actions = tuple(replace(a, revision=rev.id) if isinstance(a, PushRevision) else a for a in launch.actions)
