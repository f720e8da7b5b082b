"""Receiving blobs as a stream: bounded memory whatever the size, and a cut push resumes where it stopped.

Each blob's bytes go straight from stdin to ``blobs/.part-<sha>`` in 1 MiB pieces while they are hashed.
A push cut midway leaves that part file behind; ``blobs_missing`` reports its length, and the next push
sends only the rest (the kept prefix is hashed again from disk, so the final check covers every byte).
A verified part takes the blob's name at once; durability is settled afterwards without making the
push wait (``durability``), except for a push of a few small blobs (a one-line change), each synced before it
takes its name. Writeback of each piece starts as soon as it is written, so the disk works
while the network keeps streaming.

A blob the controller had not hashed before sending (a first push: it hashes while it sends) comes with a
``key`` instead of its ``sha256``: its bytes go to ``blobs/.part-k<key>`` and its hash follows them in the
stream (64 hex digits), checked against the hash of what arrived; verified, it takes its name at once too.
The push's journal counts such blobs, since it cannot name them before they arrive (``durability``).
"""

from __future__ import annotations

import fcntl
import io
import os
from typing import BinaryIO

from . import durability
from ..diskspace import FULL
from ..layout import Layout, fsync_dir
from ..protocol import AgentFailure

CHUNK = 1 << 20
WRITEBACK = 8 << 20
PIPE_SIZE = 1 << 20
DIGEST = 64  # the hex hash that follows a keyed blob's bytes
SYNCED_COUNT = 8  # a push of at most this many blobs and SYNCED_BYTES syncs each blob itself (``store``)
SYNCED_BYTES = 1 << 20


class Payload:
    """The request's raw bytes after its JSON line, read in bounded pieces; a short read means the push was cut."""

    def __init__(self, stream: BinaryIO, size: int) -> None:
        self._stream = stream
        self.left = size

    def read(self, n: int) -> bytes:
        n = min(n, self.left)
        data = self._stream.read(n) if n > 0 else b""
        self.left -= len(data)
        return data

    def readinto(self, buf: memoryview) -> int:
        """Fill ``buf`` (at most what is left) without a new bytes object per piece; the count read, 0 at the end."""
        view = buf[:min(len(buf), self.left)]
        done = 0
        while done < len(view):
            got = self._stream.readinto(view[done:])
            if not got:
                break
            done += got
        self.left -= done
        return done

    def widen(self) -> None:
        """A bigger pipe on stdin, where it is one: the sender (sshd) wakes this process a sixteenth as often."""
        try:
            fcntl.fcntl(self._stream.fileno(), fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        except (OSError, AttributeError, ValueError, io.UnsupportedOperation):
            pass  # not a pipe, or a smaller limit: only more wake-ups

    def skip(self, n: int) -> int:
        """Read and drop ``n`` bytes; the count actually read."""
        done = 0
        while done < n and (data := self.read(min(CHUNK, n - done))):
            done += len(data)
        return done


def _valid_sha(sha: object) -> bool:
    return isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)


def valid_key(key: object) -> bool:
    return isinstance(key, str) and 1 <= len(key) <= 64 and all(c in "0123456789abcdef" for c in key)


def part_path(layout: Layout, sha: str) -> str:
    return os.path.join(layout.blobs, f".part-{sha}")


def keyed_part_path(layout: Layout, key: str) -> str:
    return os.path.join(layout.blobs, f".part-k{key}")


def partial_sizes(layout: Layout, hashes: list, keyed: bool = False) -> dict:
    """Bytes already received of each missing blob (of each key, ``keyed``), from the part files a cut push
    left."""
    out = {}
    for name in hashes:
        if valid_key(name) if keyed else _valid_sha(name):
            try:
                size = os.stat(keyed_part_path(layout, name) if keyed else part_path(layout, name)).st_size
            except OSError:
                continue
            if size:
                out[name] = size
    return out


def sized(layout: Layout, sizes: list) -> dict:
    """The stored blobs of each of ``sizes`` (``{"<size>": [sha, ...]}``): a file the controller has not hashed
    may be one of them, and then it hashes that file before sending it."""
    wanted = {int(n) for n in sizes}
    out: dict[str, list] = {}
    if not wanted:
        return out
    try:
        entries = os.scandir(layout.blobs)
    except FileNotFoundError:
        return out
    with entries:
        for entry in entries:
            if _valid_sha(entry.name):
                try:
                    size = entry.stat().st_size
                except OSError:
                    continue
                if size in wanted:
                    out.setdefault(str(size), []).append(entry.name)
    return out


def _open_part(path: str, name: str, offset: int) -> tuple[BinaryIO, "hashlib._Hash"]:
    """The part file ``path`` (of blob or key ``name``), locked, cut to ``offset`` bytes, and a hash over those
    bytes.

    Locked so that two deploys pushing the same blob never write into one file; the identity check
    after locking catches a part that the other one finished and renamed while we waited.
    """
    import hashlib

    while True:
        fh = open(path, "a+b")
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            same = os.stat(path).st_ino == os.fstat(fh.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        fh.close()
    have = os.fstat(fh.fileno()).st_size
    if have < offset:
        fh.close()
        raise AgentFailure("agent", f"the partial copy of blob {name[:12]} on the target has {have} bytes, "
                                    f"not the {offset} the push resumes from", "deploy again")
    fh.truncate(offset)
    digest = hashlib.sha256()
    fh.seek(0)
    while fh.tell() < offset and (data := fh.read(min(CHUNK, offset - fh.tell()))):
        digest.update(data)
    fh.seek(offset)
    return fh, digest


def _receive(layout: Layout, payload: Payload, sha: str | None, size: int, offset: int,
             key: str | None = None, durable: bool = False) -> str:
    """Stream one blob into its part file, verify it, and publish it read-only under its name; a keyed one
    (``sha`` None) is checked against the hash that follows its bytes; ``durable``: synced before it takes its name.
    The blob's hash."""
    name = sha or key or ""
    fh, digest = _open_part(keyed_part_path(layout, name) if sha is None else part_path(layout, name), name, offset)
    try:
        _fill(payload, fh, digest, name, size, offset)
        told = _told(payload, fh, name) if sha is None else sha
        if digest.hexdigest() != told:
            os.unlink(fh.name)
            raise AgentFailure("agent", f"blob {told[:12]} arrived damaged ({size} bytes that do not match its "
                                        "hash)", "a file may have changed while it was sent; deploy again")
        if sha is None and os.path.isfile(layout.blob(told)):  # the same content under another path
            os.unlink(fh.name)
            return told
        if durable:
            os.fsync(fh.fileno())
        os.chmod(fh.name, 0o444)
        os.replace(fh.name, layout.blob(told))  # still under the lock: the part name is free for the next push
        return told
    except OSError as exc:
        if exc.errno not in FULL:
            raise
        try:  # a full disk is no cut: the part would only hold space nobody can use until the disk is freed
            os.unlink(fh.name)
        except OSError:
            pass
        raise OSError(exc.errno, exc.strerror, fh.name) from None
    finally:
        _close(fh)


def _close(fh: BinaryIO) -> None:
    try:
        fh.close()
    except OSError:  # the flush of what could not be written; already reported
        pass


def _told(payload: Payload, fh: BinaryIO, key: str) -> str:
    """The hash the controller sends after a keyed blob's bytes."""
    told = payload.read(DIGEST)
    if len(told) < DIGEST:
        raise AgentFailure("agent", f"the push was cut: blob {key[:12]} arrived without its hash",
                           "deploy again: only what is still missing is sent")
    sha = told.decode("ascii", "replace")
    if not _valid_sha(sha):
        os.unlink(fh.name)
        raise AgentFailure("agent", f"blob {key[:12]} arrived with {sha[:16]!r} where its hash belongs",
                           "deploy again")
    return sha


def _fill(payload: Payload, fh: BinaryIO, digest: "hashlib._Hash", sha: str, size: int, offset: int) -> None:
    want = size - offset
    buf = memoryview(bytearray(CHUNK))
    fh.flush()
    fd, at = fh.fileno(), offset
    while want:
        got = payload.readinto(buf[:min(CHUNK, want)])
        if not got:
            raise AgentFailure("agent", f"the push was cut: blob {sha[:12]} has {size - want} of {size} bytes",
                               "deploy again: only what is still missing is sent")
        data = buf[:got]
        digest.update(data)
        written = 0
        while written < got:
            written += os.write(fd, data[written:])
        want -= got
        at += got
        if at % WRITEBACK < got or not want:
            durability.start_writeback(fd)


def store(layout: Layout, payload: Payload | bytes, blobs: list) -> dict:
    """Store the streamed blobs (``{"sha256", "size", "offset"}`` each, or ``{"key", ...}`` with the hash after
    the bytes; bytes from ``offset`` on), each verified against its hash before it becomes visible. The hashes
    of keyed blobs come back under ``"hashes"`` (key -> sha256)."""
    if isinstance(payload, (bytes, bytearray)):
        payload = Payload(io.BytesIO(payload), len(payload))
    if payload.left >= WRITEBACK:
        payload.widen()
    layout.ensure()
    durability.recover(layout)
    named = [e["sha256"] for e in blobs if e.get("sha256") is not None]
    keyed = len(blobs) - len(named)
    # a few small blobs (a one-line change) are each synced before they take their name: two fsyncs for one, where
    # the journal's way is two fsyncs, a fork and a sync of the whole filesystem while the run starts
    durable = bool(blobs) and not keyed and len(blobs) <= SYNCED_COUNT and payload.left <= SYNCED_BYTES
    journal = durability.open_journal(layout, named, keyed) if blobs and not durable else None
    stored = received = 0
    hashes: dict[str, str] = {}
    try:
        for entry in blobs:
            sha, key = entry.get("sha256"), entry.get("key")
            size, offset = int(entry["size"]), int(entry.get("offset") or 0)
            if not (_valid_sha(sha) if key is None else sha is None and valid_key(key)) or size < 0 \
                    or not 0 <= offset <= size:
                raise AgentFailure("input", f"bad blob entry {sha or key!r} (size {size}, offset {offset})")
            if sha is not None and os.path.isfile(layout.blob(sha)):  # stored meanwhile (another deploy)
                payload.skip(size - offset)
                continue
            got = _receive(layout, payload, sha, size, offset, key, durable)
            if key is not None:
                hashes[key] = got
            stored += 1
            received += size - offset
        if durable and stored:
            fsync_dir(layout.blobs)  # their names: a crash before this loses a name, never a blob's bytes
    finally:
        if journal is not None:
            durability.settle_later(layout, journal)
    return {"stored": stored, "bytes": received} | ({"hashes": hashes} if hashes else {})
