"""Durable blobs without making a push wait for the disk.

A push publishes each verified blob at once and syncs afterwards, in a detached child process, so the
deploy does not wait for writeback (``tar | ssh tar x`` does not either). What makes that safe is a
small journal written durably *before* any blob of the push takes its name: ``blobs/.pending-*.json``
lists the push's blobs and the kernel's boot id. The child removes the journal once the filesystem is
synced. A journal found later means one of two things:

- the same boot: the data is in the page cache and reads back exactly; orch syncs and drops the journal;
- another boot: the machine went down before the sync finished, so the listed blobs may be short or
  zero-filled on disk. They are removed, with every revision built from them, and the next deploy sends
  them again. A blob name therefore always means verified content, durable or not yet needed to be.

A push of files the controller hashes while it sends them cannot list their hashes up front: its journal
counts them (``keyed``) instead, and after another boot every blob that took its name since the journal was
written (its ctime) is hashed again and removed, with its revisions, where it no longer matches its name.
"""

from __future__ import annotations

import json
import os
import time

from ..layout import Layout, fsync_dir, remove_tree

_LIBC: list = []
SETTLE_AFTER = 60.0  # seconds after which a same-boot journal is settled by whoever finds it
CTIME_SLACK = 2.0  # seconds: a blob's ctime is taken from the kernel's coarse clock


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
    func = getattr(_libc(), "sync_file_range", None)
    if func is not None:
        import ctypes

        func(fd, ctypes.c_longlong(0), ctypes.c_longlong(0), ctypes.c_uint(2))  # SYNC_FILE_RANGE_WRITE


def sync_folder(path: str) -> None:
    """Make everything written on ``path``'s filesystem durable: syncfs(2), else sync(2)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        syncfs = getattr(_libc(), "syncfs", None)
        if syncfs is None or syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return "unknown"


def open_journal(layout: Layout, hashes: list[str], keyed: int = 0) -> str:
    """Durably record that ``hashes`` (and ``keyed`` blobs whose hashes are not known yet) are about to be
    published unsynced; the journal's path."""
    import tempfile

    fd, path = tempfile.mkstemp(dir=layout.blobs, prefix=".pending-", suffix=".json")
    with os.fdopen(fd, "w") as fh:
        extra = {"keyed": keyed} if keyed else {}
        json.dump({"boot_id": boot_id(), "blobs": hashes, "created": time.time(), **extra}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    fsync_dir(layout.blobs)
    return path


def settle_later(layout: Layout, journal: str) -> None:
    """Sync and drop the journal in a detached child, so the caller returns at once."""
    try:
        pid = os.fork()
    except OSError:
        pid = -1
    if pid == 0:  # the child: off the caller's pipes, so the controller is not kept waiting for it
        try:
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            sync_folder(layout.blobs)
            os.unlink(journal)
        finally:
            os._exit(0)
    if pid < 0:  # no fork: sync here
        sync_folder(layout.blobs)
        os.unlink(journal)


def recover(layout: Layout) -> list[str]:
    """Settle the journals an earlier push left; the blobs removed because a reboot may have damaged them."""
    removed: list[str] = []
    try:
        names = [n for n in os.listdir(layout.blobs) if n.startswith(".pending-") and n.endswith(".json")]
    except FileNotFoundError:
        return removed
    now = boot_id()
    for name in names:
        path = os.path.join(layout.blobs, name)
        try:
            with open(path) as fh:
                entry = json.load(fh)
            age = time.time() - os.stat(path).st_mtime
        except (OSError, ValueError):
            continue  # being written, or gone meanwhile
        if entry.get("boot_id") == now:
            if age > SETTLE_AFTER:  # its writer died before syncing; the kernel has the data
                sync_folder(layout.blobs)
                _unlink(path)
            continue
        suspect = {h for h in entry.get("blobs", []) if isinstance(h, str)}
        if entry.get("keyed"):
            suspect |= _damaged_since(layout, float(entry.get("created") or 0) - CTIME_SLACK)
        for sha in suspect:
            for blob in (layout.blob(sha), layout.blob(sha) + ".x"):
                if _unlink(blob):
                    removed.append(sha)
        _drop_revisions(layout, suspect)
        _unlink(path)
    return sorted(set(removed))


def _damaged_since(layout: Layout, since: float) -> set[str]:
    """The blobs named since ``since`` (ctime) whose content, or their executable twin's, no longer hashes to
    their name."""
    import hashlib

    damaged = set()
    with os.scandir(layout.blobs) as entries:
        for entry in entries:
            name = entry.name[:-2] if entry.name.endswith(".x") else entry.name
            if len(name) != 64 or name.startswith("."):
                continue
            try:
                if entry.stat().st_ctime < since:
                    continue
                digest = hashlib.sha256()
                with open(entry.path, "rb") as fh:
                    while data := fh.read(1 << 20):
                        digest.update(data)
            except OSError:
                continue
            if digest.hexdigest() != name:
                damaged.add(name)
    return damaged


def _drop_revisions(layout: Layout, suspect: set[str]) -> None:
    """Remove the revisions whose files are hard links to a suspect blob."""
    try:
        names = os.listdir(layout.revisions)
    except FileNotFoundError:
        return
    for name in names:
        manifest = os.path.join(layout.revisions, name, ".orch-manifest.json")
        try:
            with open(manifest) as fh:
                files = json.load(fh).get("files", [])
        except (OSError, ValueError):
            continue
        if any(f.get("sha256") in suspect for f in files if isinstance(f, dict)):
            try:
                remove_tree(layout.root, os.path.join(layout.revisions, name))  # sealed: read-only folders
            except OSError:
                continue


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
