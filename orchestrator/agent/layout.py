"""The folders orch owns under a target's root, and atomic writes into them."""

from __future__ import annotations

import json
import os
import shutil
import stat


class Layout:
    """``root/{agent,blobs,revisions,runs}`` plus the lock file."""

    def __init__(self, root: str) -> None:
        if not root or not os.path.isabs(root):
            from .protocol import AgentFailure
            raise AgentFailure("input", f"the target root must be an absolute path, not {root!r}",
                               "set [paths] root (or the target's root) to an absolute folder")
        self.root = os.path.normpath(root)
        self.blobs = os.path.join(self.root, "blobs")
        self.revisions = os.path.join(self.root, "revisions")
        self.runs = os.path.join(self.root, "runs")
        self.lock = os.path.join(self.root, ".lock")

    def ensure(self) -> None:
        for d in (self.root, self.blobs, self.revisions, self.runs):
            os.makedirs(d, exist_ok=True)

    def blob(self, sha: str) -> str:
        return os.path.join(self.blobs, sha)

    def revision(self, rev: str) -> str:
        return os.path.join(self.revisions, rev)

    def run_dir(self, exp_id: int, registry: str | None = None) -> str:
        """``runs/<registry>-<exp_id>``: each registry (clone of a project) numbers its runs on its own, so
        two clones sharing a target never collide. ``runs/<exp_id>`` is a run from before registry keys."""
        return os.path.join(self.runs, run_key(exp_id, registry))


def run_key(exp_id: int, registry: str | None = None) -> str:
    return f"{registry}-{int(exp_id)}" if registry else str(int(exp_id))


def parse_run_key(name: str) -> tuple[str | None, int] | None:
    """A run folder's name as (registry, experiment number); None if it is not a run folder."""
    if name.isdigit():
        return None, int(name)
    registry, _, num = name.rpartition("-")
    if num.isdigit() and len(registry) == 12 and all(c in "0123456789abcdef" for c in registry):
        return registry, int(num)
    return None


def write_atomic(path: str, data: bytes, mode: int = 0o644) -> None:
    """Write beside the target, fsync, rename: readers see the old or the new file, never half."""
    write_all([(path, data, mode)])


def write_json(path: str, obj: object) -> None:
    write_atomic(path, json_bytes(obj))


def json_bytes(obj: object) -> bytes:
    """``obj`` as ``write_json`` writes it."""
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def write_all(files: list[tuple[str, bytes, int]]) -> None:
    """Each (path, data, mode) written beside its place, fsynced and renamed into it, their fsyncs at once: a run's start writes
    four files, and on a loaded machine each fsync waited for in turn is a wait for the disk and then for a CPU
    (several ms); these wait together. Each is renamed into place, in the order given, once all of them are on
    disk; where writing or syncing one fails, none is renamed, and no temporary file is left."""
    import tempfile

    made: list[tuple[int, str]] = []
    try:
        for path, data, mode in files:
            parent = os.path.dirname(path)
            os.makedirs(parent, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=parent, prefix=".tmp-")
            made.append((fd, tmp))
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)
        failed: list[OSError] = []

        def sync(fd: int) -> None:
            try:
                os.fsync(fd)
            except OSError as exc:
                failed.append(exc)

        helpers = []
        if len(made) > 1:  # one file (every ``write_atomic``): synced here, no thread
            import threading

            helpers = [threading.Thread(target=sync, args=(fd,), daemon=True) for fd, _tmp in made[1:]]
        for helper in helpers:
            helper.start()
        if made:
            sync(made[0][0])
        for helper in helpers:
            helper.join()
        if failed:
            raise failed[0]
        for (_fd, tmp), (path, _data, _mode) in zip(made, files):
            os.replace(tmp, path)
    except BaseException:
        for _fd, tmp in made:
            try:
                os.unlink(tmp)
            except OSError:
                pass  # renamed already, or never made
        raise
    finally:
        for fd, _tmp in made:
            os.close(fd)


def read_json(path: str, default: object = None) -> object:
    try:
        with open(path, "rb") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return default


def fsync_dir(path: str) -> None:
    """Make a folder's entries (a file just created or renamed in it) survive a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_writable(top: str) -> None:
    """Give the folders under ``top`` (a sealed, read-only revision) back their write bit, so their entries can be
    removed; symlinks are never followed."""
    for base, dirs, _files in os.walk(top):
        for d in [base] + [os.path.join(base, n) for n in dirs]:
            try:
                st = os.lstat(d)
                if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o700 != 0o700:
                    os.chmod(d, st.st_mode | 0o700)
            except OSError:
                continue


def remove_tree(root: str, path: str) -> None:
    """Remove ``path`` (a folder or file) under orch's ``root``, read-only folders included; anything that is not
    strictly inside ``root`` is refused, so a bad path can never reach outside orch's own area."""
    from .protocol import AgentFailure

    real_root, real = os.path.realpath(root), os.path.realpath(os.path.dirname(path))
    if not (real == real_root or real.startswith(real_root + os.sep)) or os.path.normpath(path) == real_root:
        raise AgentFailure("safety", f"refusing to remove {path}: it is not inside orch's root {root}")
    if os.path.isdir(path) and not os.path.islink(path):
        make_writable(path)
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)
