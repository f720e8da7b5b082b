"""Receiving blobs as a stream: bounded memory whatever the size, and a cut push resumes where it stopped.

Each blob's bytes go straight from stdin to ``blobs/.part-<sha>`` in 1 MiB pieces while they are hashed.
A push cut midway leaves that part file behind; ``blobs_missing`` reports its length, and the next push
sends only the rest (the kept prefix is hashed again from disk, so the final check covers every byte).
A verified part takes the blob's name at once; durability is settled afterwards without making the
push wait (``durability``). Writeback of each piece starts as soon as it is written, so the disk works
while the network keeps streaming.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
from typing import BinaryIO

from . import durability
from .diskspace import FULL
from .layout import Layout
from .protocol import AgentFailure

CHUNK = 1 << 20
WRITEBACK = 8 << 20
PIPE_SIZE = 1 << 20


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


def part_path(layout: Layout, sha: str) -> str:
    return os.path.join(layout.blobs, f".part-{sha}")


def partial_sizes(layout: Layout, hashes: list) -> dict:
    """Bytes already received of each missing blob, from the part files a cut push left."""
    out = {}
    for sha in hashes:
        if _valid_sha(sha):
            try:
                size = os.stat(part_path(layout, sha)).st_size
            except OSError:
                continue
            if size:
                out[sha] = size
    return out


def _open_part(layout: Layout, sha: str, offset: int) -> tuple[BinaryIO, "hashlib._Hash"]:
    """The part file for ``sha``, locked, cut to ``offset`` bytes, and a hash over those bytes.

    Locked so that two deploys pushing the same blob never write into one file; the identity check
    after locking catches a part that the other one finished and renamed while we waited.
    """
    path = part_path(layout, sha)
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
        raise AgentFailure("agent", f"the partial copy of blob {sha[:12]} on the target has {have} bytes, "
                                    f"not the {offset} the push resumes from", "deploy again")
    fh.truncate(offset)
    digest = hashlib.sha256()
    fh.seek(0)
    while fh.tell() < offset and (data := fh.read(min(CHUNK, offset - fh.tell()))):
        digest.update(data)
    fh.seek(offset)
    return fh, digest


def _receive(layout: Layout, payload: Payload, sha: str, size: int, offset: int) -> None:
    """Stream one blob into its part file, verify it, and publish it read-only under its name."""
    fh, digest = _open_part(layout, sha, offset)
    try:
        _fill(layout, payload, fh, digest, sha, size, offset)
    except OSError as exc:
        if exc.errno not in FULL:
            raise
        try:  # a full disk is no cut: the part would only hold space nobody can use until the disk is freed
            os.unlink(fh.name)
        except OSError:
            pass
        raise OSError(exc.errno, exc.strerror, fh.name) from None
    finally:
        try:
            fh.close()
        except OSError:  # the flush of what could not be written; already reported
            pass


def _fill(layout: Layout, payload: Payload, fh: BinaryIO, digest: "hashlib._Hash", sha: str, size: int,
          offset: int) -> None:
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
    if digest.hexdigest() != sha:
        os.unlink(fh.name)
        raise AgentFailure("agent", f"blob {sha[:12]} arrived damaged ({size} bytes that do not match its hash)",
                           "a file may have changed while it was sent; deploy again")
    os.chmod(fh.name, 0o444)
    os.replace(fh.name, layout.blob(sha))  # still under the lock: the part name is free for the next push


def store(layout: Layout, payload: Payload | bytes, blobs: list) -> dict:
    """Store the streamed blobs (``{"sha256", "size", "offset"}`` each, bytes from ``offset`` on), each
    verified against its hash before it becomes visible."""
    if isinstance(payload, (bytes, bytearray)):
        payload = Payload(io.BytesIO(payload), len(payload))
    if payload.left >= WRITEBACK:
        payload.widen()
    layout.ensure()
    durability.recover(layout)
    journal = durability.open_journal(layout, [e.get("sha256") for e in blobs]) if blobs else None
    stored = received = 0
    try:
        for entry in blobs:
            sha, size, offset = entry["sha256"], int(entry["size"]), int(entry.get("offset") or 0)
            if not _valid_sha(sha) or size < 0 or not 0 <= offset <= size:
                raise AgentFailure("input", f"bad blob entry {sha!r} (size {size}, offset {offset})")
            if os.path.isfile(layout.blob(sha)):  # stored meanwhile (another deploy): drop its bytes
                payload.skip(size - offset)
                continue
            _receive(layout, payload, sha, size, offset)
            stored += 1
            received += size - offset
    finally:
        if journal is not None:
            durability.settle_later(layout, journal)
    return {"stored": stored, "bytes": received}
