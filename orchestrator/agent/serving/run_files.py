"""A run's results as files the controller can fetch: listed with size and sha256, sent as frames from an offset.

Three sources, each a folder on the target, each key a path under one of them:

    checkpoints/<rel>   the checkpoint folder (or one of its trash entries); with ``own``, the files the run
                        wrote (``ckpt_writers``), from the folder or the trash entry a clean moved them to
    outputs/<rel>       what the run wrote in its work folder (the revision's own files and __pycache__ left out)
    train.log           the run's log

Symlinks are never followed: a linked file or folder is listed under ``skipped`` and never read, and every file
is opened with ``O_NOFOLLOW`` after checking that no part of its path is a link, so a link planted in a run's
outputs cannot send a file from elsewhere. Hashes are kept in the run folder (``.orch-pull-hashes.json``) by
device, inode, size, mtime and ctime, so listing an unchanged folder again reads no file.

``send`` writes each file's bytes from the asked offset as data frames (``{"k": index}``), then an empty frame
``{"k": index, "end": true, "size", "sha256"}`` with the hash of the whole file as read, the resumed prefix included.
"""

from __future__ import annotations

import fcntl
import fnmatch
import hashlib
import os
import stat
import sys

from ..ckpt import checkpoints as ckpt, ckpt_layout, ckpt_writers
from ..layout import Layout, read_json, write_json
from ..protocol import AgentFailure, data_frame, frame_head
from ..run.runs import LOG

CHUNK = 1 << 20
PIPE = 4 << 20  # the stdout pipe's size while sending (the kernel caps it at fs/pipe-max-size, 1 MiB for others)
CACHE = ".orch-pull-hashes.json"
SOURCES = ("checkpoints", "outputs")
SKIP_DIRS = ("__pycache__",)


def _run_dir(layout: Layout, exp_id: int, registry: str | None) -> str:
    run_dir = layout.run_dir(exp_id, registry)
    if not os.path.isdir(run_dir) or os.path.islink(run_dir):
        raise AgentFailure("notfound", f"experiment {exp_id} has no run folder on this target",
                           "check the experiment id and the target (orch experiments list); "
                           "of a job, orch pull --node 1")
    return run_dir


def _roots(layout: Layout, run_dir: str, checkpoints: str | None, entry: str | None, outputs: bool,
           log: bool) -> dict:
    """source -> its folder on the target (``train.log``: the run folder); each checked to be no symlink."""
    roots = {}
    if checkpoints is not None:
        checkpoints = ckpt_layout.now_at(run_dir, checkpoints)
        norm = ckpt.check_path(layout, checkpoints, checkpoints, busy_check=False)
        roots["checkpoints"] = ckpt.entry_path(norm, entry) if entry else norm
    if outputs:
        roots["outputs"] = os.path.join(run_dir, "work")
    if log:
        roots[LOG] = run_dir
    for name, root in roots.items():
        if os.path.lexists(root) and os.path.realpath(root) != os.path.normpath(root):
            raise AgentFailure("safety", f"the {name} folder {root} resolves through a symlink to "
                                         f"{os.path.realpath(root)}: orch does not follow it",
                               "pull from the real folder, or remove the link")
    return roots


def _revision_files(layout: Layout, run_dir: str) -> dict:
    """rel -> (dev, ino) of the run's revision files: in its work folder they are hard links, not outputs."""
    launch = read_json(os.path.join(run_dir, "launch.json"), {}) or {}
    if not isinstance(launch, dict) or not isinstance(launch.get("revision"), str) or "/" in launch["revision"]:
        return {}
    rev_dir = layout.revision(launch["revision"])
    out = {}
    for base, dirs, names in os.walk(rev_dir):
        for name in names:
            full = os.path.join(base, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            out[os.path.relpath(full, rev_dir)] = (st.st_dev, st.st_ino)
    return out


def _matches(key: str, rel: str, globs: list) -> bool:
    return not globs or any(fnmatch.fnmatchcase(rel, g) or fnmatch.fnmatchcase(key, g) for g in globs)


def _walk(layout: Layout, source: str, root: str, run_dir: str, globs: list, files: list, skipped: list) -> None:
    """Every regular file under ``root`` (no link followed), as ``(key, rel, lstat)`` in ``files``."""
    if source == LOG:
        full = os.path.join(root, LOG)
        try:
            st = os.lstat(full)
        except FileNotFoundError:
            return
        if stat.S_ISREG(st.st_mode):
            files.append((LOG, LOG, full, st))
        elif _matches(LOG, LOG, globs):
            skipped.append({"key": LOG, "why": "a symlink" if stat.S_ISLNK(st.st_mode) else "not a plain file"})
        return
    if not os.path.isdir(root):
        return
    skip_top = ckpt.skipped(layout, root) if source == "checkpoints" else frozenset()
    ignore = ckpt.IGNORE if source == "checkpoints" else ()
    revision = _revision_files(layout, run_dir) if source == "outputs" else {}
    for base, dirs, names in os.walk(root):  # os.walk never descends into a linked folder
        keep = []
        for d in sorted(dirs):
            full = os.path.join(base, d)
            rel = os.path.relpath(full, root)
            if (base == root and d in skip_top) or d in SKIP_DIRS or ckpt.ignored(d, ignore):
                continue
            if os.path.islink(full):
                skipped.append({"key": f"{source}/{rel}", "why": "a symlink to a folder"})
                continue
            keep.append(d)
        dirs[:] = keep
        for name in sorted(names):
            full = os.path.join(base, name)
            rel = os.path.relpath(full, root)
            key = f"{source}/{rel}"
            if ckpt.ignored(name, ignore) or (base == root and source == "checkpoints" and name == ckpt.META):
                continue
            try:
                st = os.lstat(full)
            except OSError:
                continue
            if not _matches(key, rel, globs):
                continue
            if stat.S_ISLNK(st.st_mode):
                skipped.append({"key": key, "why": "a symlink"})
            elif not stat.S_ISREG(st.st_mode):
                skipped.append({"key": key, "why": "not a plain file"})
            elif revision.get(rel) != (st.st_dev, st.st_ino):
                files.append((key, rel, full, st))


def _widen(out) -> None:
    """A pipe to the reader (sshd, or orch itself on this machine) that holds whole frames: without it each 64 KiB
    waits for the reader to be scheduled, which on a busy machine costs more than the bytes."""
    try:
        fcntl.fcntl(out.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE)
    except (OSError, ValueError, AttributeError):
        pass  # a socket, or a pipe the system keeps small: only slower


def _stamp(st: os.stat_result) -> list:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _open(full: str, root: str) -> tuple[int, os.stat_result]:
    """``full`` opened for reading, refused when any part of its path under ``root`` is a link."""
    if os.path.realpath(full) != full or not full.startswith(root.rstrip("/") + "/"):
        raise AgentFailure("safety", f"{full} leads out of {root} through a symlink: not sent")
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise AgentFailure("notfound", f"{full} is gone from the target", "pull again to list what is there now") \
            from None
    except OSError as exc:
        raise AgentFailure("safety" if exc.errno == 40 else "agent", f"cannot read {full}: {exc.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise AgentFailure("safety", f"{full} is not a plain file: not sent")
    return fd, st


def _hash(fd: int) -> str:
    digest = hashlib.sha256()
    while data := os.read(fd, CHUNK):
        digest.update(data)
    return digest.hexdigest()


class _Hashes:
    """Known sha256 of files by (device, inode, size, mtime, ctime), kept in the run folder."""

    def __init__(self, run_dir: str) -> None:
        self.path = os.path.join(run_dir, CACHE)
        data = read_json(self.path, {})
        self.known = data if isinstance(data, dict) else {}
        self.changed = False

    def get(self, full: str, st: os.stat_result) -> str | None:
        entry = self.known.get(full)
        return entry[1] if isinstance(entry, list) and len(entry) == 2 and entry[0] == _stamp(st) else None

    def put(self, full: str, st: os.stat_result, sha: str) -> None:
        self.known[full] = [_stamp(st), sha]
        self.changed = True

    def save(self, keep: set) -> None:
        if self.changed or set(self.known) - keep:
            self.known = {k: v for k, v in self.known.items() if k in keep}
            try:
                write_json(self.path, self.known)
            except OSError:
                pass  # only a cache: the next listing hashes again


def _own(layout: Layout, run_dir: str, norm: str, exp_id: int, registry: str | None, globs: list,
         skipped: list) -> list:
    """The checkpoint files run ``exp_id`` wrote (``ckpt_writers``), as ``(key, rel, full, st, root, entry)``:
    those in its folder, and those a clean moved from it into one of the folder's trash entries (the newest copy
    of each, from entries made after it started). A file in the folder that another run wrote, or that was
    written after the run ended by none the target knows, is not its own: it goes to ``skipped``, saying so."""
    runs = ckpt_writers.folder_runs(layout, norm)
    me = next((r for r in runs if ckpt_writers.is_run(r, exp_id, registry)), None)
    ended = me["ended"] if me is not None and isinstance(me.get("ended"), (int, float)) else float("inf")
    here: list = []
    _walk(layout, "checkpoints", norm, run_dir, globs, here, skipped)
    out = []
    for key, rel, full, st in here:
        who = ckpt_writers.writer_of(st.st_mtime, runs)
        if who is not None and not ckpt_writers.is_run(who, exp_id, registry):
            skipped.append({"key": key, "why": ckpt_writers.written_by(who, registry),
                            "writer": {k: who.get(k) for k in ("id", "registry")}})
        elif who is None and me is not None and st.st_mtime > ended + ckpt_writers.SLACK:
            skipped.append({"key": key, "why": f"written after experiment {exp_id} ended, by no run this "
                                               "target has a record of"})
        else:
            out.append((key, rel, full, st, norm, None))
    if me is None:
        return out
    taken = {f[0] for f in out}
    for e in reversed(ckpt.trash_entries(norm)):  # newest first: a file moved twice is the newer copy
        created = (read_json(os.path.join(e["path"], ckpt.META), {}) or {}).get("created")
        if isinstance(created, (int, float)) and created < me["started"]:
            continue  # made before the run started: none of its files can be the run's
        moved: list = []
        _walk(layout, "checkpoints", e["path"], run_dir, globs, moved, [])
        for key, rel, full, st in moved:
            if key not in taken and ckpt_writers.is_run(ckpt_writers.writer_of(st.st_mtime, runs), exp_id, registry):
                taken.add(key)
                out.append((key, rel, full, st, e["path"], e["name"]))
    return out


def _select(layout: Layout, exp_id: int, registry: str | None, checkpoints: str | None, entry: str | None,
            outputs: bool, log: bool, globs: list | None, own: bool = False) -> tuple[str, dict, list, list]:
    """The files of the selection, ``(key, rel, full, st, root, entry)`` each; ``own``: of the checkpoints, the
    run's own (``_own``), wherever a clean moved them, rather than what the folder holds now."""
    run_dir = _run_dir(layout, exp_id, registry)
    roots = _roots(layout, run_dir, checkpoints, entry, outputs, log)
    files, skipped = [], []
    for source, root in roots.items():
        if source == "checkpoints" and own and entry is None:
            files += _own(layout, run_dir, root, exp_id, registry, list(globs or []), skipped)
            continue
        found: list = []
        _walk(layout, source, root, run_dir, list(globs or []), found, skipped)
        files += [(key, rel, full, st, root, None) for key, rel, full, st in found]
    return run_dir, roots, files, skipped


def manifest(layout: Layout, exp_id: int, registry: str | None = None, checkpoints: str | None = None,
             entry: str | None = None, outputs: bool = False, log: bool = False, globs: list | None = None,
             hash: list | None = None, own: bool = False) -> dict:
    """The files a pull may fetch: key, size and the sha256 where it is known (cached, or asked in ``hash``,
    a list of keys; ``["*"]``: every file), the trash entry a file comes from (``own``), and what was left out
    (``skipped``: links, devices, another run's checkpoints)."""
    run_dir, roots, files, skipped = _select(layout, exp_id, registry, checkpoints, entry, outputs, log, globs, own)
    cache = _Hashes(run_dir)
    wanted = set(hash or [])
    out = []
    for key, _rel, full, st, root, moved_to in files:
        item = {"key": key, "size": st.st_size, "mtime": st.st_mtime}
        if moved_to is not None:
            item["entry"] = moved_to
        sha = cache.get(full, st)
        if sha is None and (key in wanted or "*" in wanted):
            fd, fst = _open(full, root)
            try:
                sha = _hash(fd)
            finally:
                os.close(fd)
            cache.put(full, fst, sha)
        if sha is not None:
            item["sha256"] = sha
        out.append(item)
    cache.save({f[2] for f in files})
    return {"files": out, "skipped": skipped, "roots": roots}


def send(layout: Layout, exp_id: int, files: list, registry: str | None = None, checkpoints: str | None = None,
         entry: str | None = None, outputs: bool = False, log: bool = False, own: bool = False) -> dict:
    """Write ``files`` (``{"key", "offset"}`` each) as frames: each file's bytes from its offset, then its end
    frame with its size and the sha256 of all of it. Only files under the selection's folders, reached through
    no link, are sent; with ``own``, a checkpoint only from where the manifest found the run's own."""
    out = sys.stdout.buffer  # frames go out between the request and the envelope
    run_dir = _run_dir(layout, exp_id, registry)
    roots = _roots(layout, run_dir, checkpoints, entry, outputs, log)
    mine = None
    if own and entry is None and "checkpoints" in roots and any(f["key"].startswith("checkpoints/") for f in files):
        mine = {f[0]: (f[4], f[2]) for f in _own(layout, run_dir, roots["checkpoints"], exp_id, registry, [], [])}
    cache = _Hashes(run_dir)
    _widen(out)
    sent = 0
    for index, item in enumerate(files):
        key, offset = item["key"], int(item.get("offset") or 0)
        source, _, rel = key.partition("/")
        root = roots.get(LOG if key == LOG else source)
        if root is None or (key != LOG and not rel) or (mine is not None and source == "checkpoints"
                                                        and key not in mine):
            raise AgentFailure("input", f"{key!r} is not one of the files this pull lists")
        if mine is not None and source == "checkpoints":
            root, full = mine[key]
        else:
            full = os.path.join(root, LOG if key == LOG else rel)
        fd, st = _open(full, root)
        try:
            digest = hashlib.sha256()
            done = 0
            while done < offset and (data := os.read(fd, min(CHUNK, offset - done))):
                digest.update(data)
                done += len(data)
            if done < offset:
                raise AgentFailure("conflict", f"{key} on the target has {done} bytes, fewer than the {offset} "
                                               "kept here", "pull again with --force")
            while data := os.read(fd, CHUNK):
                digest.update(data)
                out.write(frame_head({"k": index}, len(data)))  # the header, then the bytes as read: no copy
                out.write(data)
                sent += len(data)
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        sha = digest.hexdigest()
        out.write(data_frame({"k": index, "end": True, "size": size, "sha256": sha}, b""))
        out.flush()
        if size == st.st_size:
            cache.put(full, st, sha)
    cache.save(set(cache.known))
    return {"files": len(files), "bytes": sent}
