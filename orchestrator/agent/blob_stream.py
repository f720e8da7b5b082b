"""Receiving blobs as a stream: bounded memory whatever the size, and a cut push resumes where it stopped.

Each blob's bytes go straight from stdin to ``blobs/.part-<sha>`` in 1 MiB pieces while they are hashed.
A push cut midway leaves that part file behind; ``blobs_missing`` reports its length, and the next push
sends only the rest (the kept prefix is hashed again from disk, so the final check covers every byte).
A verified part is renamed ``.ready-<sha>-…`` at once, freeing the part name, and takes the blob's name
only after a filesystem sync: a blob name always means complete, durable content. Writeback of each
piece starts as soon as it is written (``sync_file_range``, which does not wait), and the syncs run in a
background thread every ``BATCH`` bytes, so the disk works while the network keeps streaming and the
final sync has little left to wait for.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
import threading
from typing import BinaryIO

from .diskspace import FULL
from .layout import Layout
from .protocol import AgentFailure

CHUNK = 1 << 20
BATCH = 64 << 20
WRITEBACK = 8 << 20


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


_LIBC: list = []


def _libc() -> object | None:
    if not _LIBC:
        try:
            import ctypes

            _LIBC.append(ctypes.CDLL(None, use_errno=True))
        except OSError:
            _LIBC.append(None)
    return _LIBC[0]


def start_writeback(fd: int) -> None:
    """Ask the kernel to start writing ``fd``'s dirty pages now, without waiting (Linux; elsewhere a no-op)."""
    libc = _libc()
    func = getattr(libc, "sync_file_range", None)
    if func is not None:
        import ctypes

        func(fd, ctypes.c_longlong(0), ctypes.c_longlong(0), ctypes.c_uint(2))  # SYNC_FILE_RANGE_WRITE


def sync_folder(path: str) -> None:
    """Make everything written under ``path``'s filesystem durable: syncfs(2), else sync(2)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        syncfs = getattr(_libc(), "syncfs", None)
        if syncfs is None or syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


class _Publisher:
    """Gives verified blobs their names after a sync, a batch at a time, in a background thread."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.pending: list[tuple[str, str]] = []
        self.pending_bytes = 0
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.published = 0

    def add(self, ready: str, sha: str, size: int) -> None:
        self.pending.append((ready, sha))
        self.pending_bytes += size
        if self.pending_bytes >= BATCH:
            self._flush(background=True)

    def _publish(self, batch: list[tuple[str, str]]) -> None:
        try:
            sync_folder(self.layout.blobs)
            for ready, sha in batch:
                os.replace(ready, self.layout.blob(sha))
                self.published += 1
        except BaseException as exc:  # reported by close()
            self.error = exc

    def _flush(self, background: bool) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        batch, self.pending, self.pending_bytes = self.pending, [], 0
        if not batch:
            return
        if background:
            self.thread = threading.Thread(target=self._publish, args=(batch,), daemon=True)
            self.thread.start()
        else:
            self._publish(batch)

    def close(self) -> None:
        self._flush(background=False)
        if self.error is not None:
            raise self.error


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


def _receive(layout: Layout, payload: Payload, sha: str, size: int, offset: int) -> str:
    """Stream one blob into its part file; the path of the verified, read-only copy ready to publish."""
    fh, digest = _open_part(layout, sha, offset)
    try:
        return _fill(layout, payload, fh, digest, sha, size, offset)
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
          offset: int) -> str:
    want = size - offset
    while want:
        data = payload.read(min(CHUNK, want))
        if not data:
            fh.flush()
            raise AgentFailure("agent", f"the push was cut: blob {sha[:12]} has {size - want} of {size} bytes",
                               "deploy again: only what is still missing is sent")
        fh.write(data)
        digest.update(data)
        want -= len(data)
        if fh.tell() % WRITEBACK < len(data) or not want:
            fh.flush()
            start_writeback(fh.fileno())
    fh.flush()
    if digest.hexdigest() != sha:
        os.unlink(fh.name)
        raise AgentFailure("agent", f"blob {sha[:12]} arrived damaged ({size} bytes that do not match its hash)",
                           "a file may have changed while it was sent; deploy again")
    os.chmod(fh.name, 0o444)
    fd, ready = tempfile.mkstemp(dir=layout.blobs, prefix=f".ready-{sha[:12]}-")
    os.close(fd)
    os.replace(fh.name, ready)  # still under the lock: the part name is free for the next push
    return ready


def store(layout: Layout, payload: Payload | bytes, blobs: list) -> dict:
    """Store the streamed blobs (``{"sha256", "size", "offset"}`` each, bytes from ``offset`` on), each
    verified against its hash before it becomes visible."""
    if isinstance(payload, (bytes, bytearray)):
        import io

        payload = Payload(io.BytesIO(payload), len(payload))
    layout.ensure()
    publisher = _Publisher(layout)
    received = 0
    try:
        for entry in blobs:
            sha, size, offset = entry["sha256"], int(entry["size"]), int(entry.get("offset") or 0)
            if not _valid_sha(sha) or size < 0 or not 0 <= offset <= size:
                raise AgentFailure("input", f"bad blob entry {sha!r} (size {size}, offset {offset})")
            if os.path.isfile(layout.blob(sha)):  # stored meanwhile (another deploy): drop its bytes
                payload.skip(size - offset)
                continue
            publisher.add(_receive(layout, payload, sha, size, offset), sha, size)
            received += size - offset
    except BaseException:
        try:  # what was verified before the failure still takes its name: a resumed push skips it
            publisher.close()
        except Exception:
            pass
        raise
    publisher.close()
    return {"stored": publisher.published, "bytes": received}
