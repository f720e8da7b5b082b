"""Files on the controller: atomic writes (a reader sees the old content or the new, never a part), and the
one reader that hashes a file's content.

    >>> atomic_write(state_dir / "current.json", '{"ct": 200}\\n')
    >>> atomic_write(state_dir / "ct-cache.json", payload, mode=0o600)   # a file only its owner reads
    >>> atomic_write(cache_dir / "hashes.json", payload, durable=False)  # a cache: atomic, not flushed

The data goes to a temporary file beside the target (same folder, so the rename never crosses a file
system), is flushed to disk, and replaces the target by rename; the folder is flushed too, so the
rename survives a power cut. On any failure the temporary file is removed and the old file is left as
it was. A file whose loss costs only time (a cache) can skip the flushes (``durable=False``): readers still
see the old content or the new. The agent has its own helper (it ships alone).

    >>> sha256_file(path)                              # the whole file
    >>> sha256_file(path, size=4096, advance=bar.advance)  # its first 4096 bytes; EOFError if it has fewer
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path
from typing import Callable

READ = 1 << 20  # bytes per read while hashing: one buffer, reused


def sha256_file(path: os.PathLike | str, size: int | None = None,
                advance: Callable[[int], object] | None = None) -> str:
    """The sha256 of the file's first ``size`` bytes (None: all of them), read into one buffer (hashlib and
    ``readinto`` release the GIL, so several files hash on several cores); ``advance`` is told each read's length.

    Raises the ``OSError`` of the open or a read, and ``EOFError`` when the file has fewer than ``size`` bytes.
    """
    digest, buf = hashlib.sha256(), bytearray(READ)
    view = memoryview(buf)
    left = size
    with open(path, "rb", buffering=0) as fh:
        while left is None or left > 0:
            got = fh.readinto(view if left is None else view[:min(READ, left)])
            if not got:
                if left:
                    raise EOFError(f"{path} has {left} bytes fewer than {size}")
                break
            digest.update(view[:got])
            if left is not None:
                left -= got
            if advance is not None:
                advance(got)
    return digest.hexdigest()


def atomic_write(path: Path | str, data: bytes | str, *, mode: int = 0o666, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` (str is written as UTF-8); ``mode`` is filtered by the umask.

    Raises the ``OSError`` of the step that failed; the target is then unchanged.
    """
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        _sync_folder(path.parent)


def _sync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot flush a folder; the rename is done all the same
        pass
    finally:
        os.close(fd)
