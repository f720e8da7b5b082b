"""``orch pull``: a run's checkpoints, outputs and log copied to this machine, sending only what is missing.

    sel = Selection(checkpoints="/workspace/checkpoints", outputs=True, log=True, globs=["*.pt"])
    res = pull(settings, target, 14, run_registry, sel, Path("orch-pull/exp14"), meter=meter)

The target lists the files with their sizes and sha256 (``files_manifest``, hashes cached there); a file here
with the same size and hash is not sent, one that differs is refused without ``force`` before anything is
written. The rest streams as frames (``files_send``) into ``.<name>.part`` files beside their final names, one
piece at a time, hashed on arrival; a file takes its name only once its hash is the target's. A link that drops
after bytes came is taken up again at once (``RESUMES`` times); a pull cut for good keeps its parts, and the next
asks each from the length it has. Hashes of the files here are kept in
``<dest>/.orch-pull.json`` by size, mtime and inode, so an unchanged folder is not read again.
"""

from __future__ import annotations

import errno
import hashlib
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable

from ..agent.protocol import AgentFailure
from ..agent.serving.validate import pull_key
from ..config import Settings
from ..errors import AgentError, ConflictError, InputError, TransportError
from ..files import atomic_write, sha256_file
from .meter import Count, Meter, silent
from ..reach.targets import Target
from ..watch.metrics import format_size
from .pull_plan import SENDS, Item, Local, plan, summary, unknown

CACHE = ".orch-pull.json"
CHUNK = 1 << 20
RESUMES = 3  # times a dropped link is taken up again within one pull, when bytes came before it dropped


@dataclass
class Selection:
    """What to pull: the checkpoint folder (or its trash ``entry``), the outputs, the log, filtered by ``globs``."""

    checkpoints: str | None = None
    entry: str | None = None
    outputs: bool = False
    log: bool = False
    globs: list[str] = field(default_factory=list)

    def args(self, exp_id: int, registry: str | None) -> dict:
        """The agent's arguments: of the checkpoints, the files the run wrote (``own``), wherever a clean moved
        them, never what another run left in the folder; a named trash entry, as it is."""
        return {"exp_id": exp_id, "registry": registry, "checkpoints": self.checkpoints, "entry": self.entry,
                "outputs": self.outputs, "log": self.log, "own": self.checkpoints is not None and self.entry is None}


@dataclass
class Pulled:
    dest: str
    items: list[Item]
    skipped: list[dict]
    sent: int = 0
    dry_run: bool = False

    def public(self) -> dict:
        return {"dest": self.dest, "summary": summary(self.items), "sent_bytes": self.sent,
                "files": [asdict(i) for i in self.items], "skipped": self.skipped, "dry_run": self.dry_run}


def part_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.part")


def _checked_key(key: object) -> str:
    try:
        return pull_key(key)
    except AgentFailure:
        raise AgentError(f"the target listed {str(key)[:200]!r}, which is not a file orch can write here",
                         hint="the target's agent may be broken: rerun, and report it") from None


def _read_cache(dest: Path) -> dict:
    import json

    try:
        data = json.loads((dest / CACHE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(dest: Path, known: dict) -> None:
    import json

    try:
        atomic_write(dest / CACHE, json.dumps(known, sort_keys=True).encode())
    except OSError:
        pass  # only a cache: the next pull hashes again


def _stamp(st: os.stat_result) -> list:
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _local(dest: Path, key: str, size: int, known: dict) -> Local:
    """The state here of ``key``; its hash (from the cache, else read) only when its size is the target's."""
    path = dest / key
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        try:
            return Local(part=os.lstat(part_path(path)).st_size)
        except OSError:
            return Local()
    except NotADirectoryError:  # a file here where the target has a folder
        return Local(kind="dir")
    import stat

    if stat.S_ISDIR(st.st_mode):
        return Local(kind="dir")
    if not stat.S_ISREG(st.st_mode):
        return Local(kind="other", size=st.st_size)
    if st.st_size != size:
        return Local(kind="file", size=st.st_size)
    entry = known.get(key)
    if isinstance(entry, list) and len(entry) == 2 and entry[0] == _stamp(st):
        return Local(kind="file", size=st.st_size, sha256=entry[1])
    sha = sha256_file(path)
    known[key] = [_stamp(st), sha]
    return Local(kind="file", size=st.st_size, sha256=sha)


class _Receiver:
    """Frames in, files out: each piece appended to the file's part, hashed, and the part renamed when whole."""

    def __init__(self, dest: Path, items: list[Item], known: dict, bar: Count) -> None:
        self.dest, self.items, self.known, self.bar = dest, items, known, bar
        self.index: int | None = None
        self.fh: BinaryIO | None = None
        self.digest = hashlib.sha256()
        self.received = 0
        self.done: list[str] = []
        self.failed: list[str] = []

    def _open(self, index: int) -> None:
        item = self.items[index]
        path = self.dest / item.key
        path.parent.mkdir(parents=True, exist_ok=True)
        part = part_path(path)
        fh = open(part, "r+b" if item.offset else "wb")
        self.digest = hashlib.sha256()
        if item.offset:  # the kept prefix, hashed again: the final check covers every byte
            fh.truncate(item.offset)
            while data := fh.read(CHUNK):
                self.digest.update(data)
            fh.seek(item.offset)
        self.index, self.fh = index, fh

    def __call__(self, header: dict, data: bytes) -> None:
        index = header.get("k")
        if not isinstance(index, int) or not 0 <= index < len(self.items):
            raise AgentError("the target sent a piece of a file this pull did not ask for",
                             hint="the target's agent may be broken: rerun, and report it")
        if index != self.index:
            self.close()
            self._open(index)
        assert self.fh is not None
        if data:
            self.fh.write(data)
            self.digest.update(data)
            self.received += len(data)
            self.bar.advance(len(data))
        if header.get("end"):
            self._finish(header)

    def _finish(self, header: dict) -> None:
        assert self.fh is not None and self.index is not None
        item = self.items[self.index]
        self.fh.close()
        self.fh, self.index = None, None
        path = self.dest / item.key
        part = part_path(path)
        sha = self.digest.hexdigest()
        if sha != header.get("sha256") or os.path.getsize(part) != header.get("size"):
            part.unlink()  # a resumed prefix from an older version of the file, or the file changed as it was read
            self.failed.append(item.key)
            return
        os.replace(part, path)
        self.known[item.key] = [_stamp(os.lstat(path)), sha]
        self.done.append(item.key)
        self.bar.advance(0, files=1)

    def close(self) -> None:
        """A file left half-received (the link was cut): its part keeps what arrived, for the next pull."""
        if self.fh is not None:
            self.fh.close()
            self.fh, self.index = None, None


def _listing(client, sel: Selection, exp_id: int, registry: str | None, hash: list | None = None) -> dict:
    return client.one("files_manifest", **sel.args(exp_id, registry), globs=sel.globs, hash=hash)


def pull(settings: Settings, target: Target, exp_id: int, registry: str | None, sel: Selection, dest: Path, *,
         force: bool = False, dry_run: bool = False, meter: Meter | None = None,
         notice: Callable[[str], None] = lambda _m: None) -> Pulled:
    """Bring the selected files of run ``exp_id`` on ``target`` into ``dest``; what came (or would: ``dry_run``)."""
    from ..records.reconcile import client_for

    client = client_for(settings, target)
    try:
        listed = _listing(client, sel, exp_id, registry)
        remote = listed["files"]
        for f in remote:
            _checked_key(f.get("key"))
        known = _read_cache(dest)
        local = {f["key"]: _local(dest, f["key"], int(f["size"]), known) for f in remote}
        items = plan(remote, local, force=force)
        ask = unknown(items)
        if ask:  # same size on both sides: the target's hash decides
            hashed = {f["key"]: f for f in _listing(client, sel, exp_id, registry, hash=ask)["files"]}
            remote = [hashed.get(f["key"], f) for f in remote]
            items = plan(remote, local, force=force)
        clash = [i.key for i in items if i.action in ("conflict", "unknown")]
        if clash:
            shown = ", ".join(clash[:8]) + (f" and {len(clash) - 8} more" if len(clash) > 8 else "")
            raise ConflictError(f"{len(clash)} file(s) in {dest} differ from experiment {exp_id}'s own: {shown}",
                                hint=f"the target's are the ones experiment {exp_id} wrote last: orch pull --force "
                                     "replaces these with them, or --to another folder keeps both")
        result = Pulled(str(dest), items, listed.get("skipped") or [], dry_run=dry_run)
        todo = [i for i in items if i.action in SENDS]
        if dry_run:
            return result
        need, free = sum(i.sends for i in todo), None
        try:
            dest.mkdir(parents=True, exist_ok=True)
            free = _free(dest)
            if need > free:
                raise InputError(f"{dest} has {format_size(free)} free and this pull needs {format_size(need)} "
                                 f"({len(todo)} file(s)); nothing was pulled",
                                 hint=f"free {format_size(need - free)} there, pull into another folder (--to), "
                                      "or pull less (GLOBs, --checkpoints, --outputs, --log)")
            if todo:
                result.sent = _transfer(settings, client, sel, exp_id, registry, dest, todo, known, meter, notice)
        except OSError as exc:
            full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
            said = f"; this pull needs {format_size(need)}, {format_size(free)} was free when it began" \
                if full and free is not None else ""
            raise InputError(f"cannot write {exc.filename or dest}: {exc.strerror}{said}",
                             hint="check the folder orch pull writes into (--to) and its free space; the same "
                                  "orch pull goes on from what came") from None
        _write_cache(dest, known)
        return result
    finally:
        client.transport.close()


def _free(folder: Path) -> int:
    """Bytes free for this user in ``folder``'s filesystem (what a write there may use)."""
    import shutil

    return shutil.disk_usage(folder).free


def _transfer(settings: Settings, client, sel: Selection, exp_id: int, registry: str | None, dest: Path,
              todo: list[Item], known: dict, meter: Meter | None, notice: Callable[[str], None]) -> int:
    """Send ``todo``; a link that drops after bytes came is taken up again at once from what the parts hold
    (``RESUMES`` times), and a pull cut for good keeps its parts for the next."""
    from ..reach.agent_client import Op

    total = sum(i.sends for i in todo)
    received, done, failed = 0, 0, []
    client.transport.direct()  # the bytes on a connection of this process: a keeper would relay each one again
    with (meter or silent)("pulling", total, len(todo)) as bar:
        for attempt in range(RESUMES + 1):
            args = {**sel.args(exp_id, registry), "files": [{"key": i.key, "offset": i.offset} for i in todo]}
            receiver = _Receiver(dest, todo, known, bar)
            try:
                client.call([Op("files_send", args)], on_frame=receiver, what="pull",
                            timeout=settings.ssh.command_timeout)
                break
            except TransportError as exc:
                receiver.close()
                _write_cache(dest, known)
                received, done = received + receiver.received, done + len(receiver.done)
                if attempt == RESUMES or not receiver.received:
                    raise TransportError(f"the pull was cut after {received} of {total} bytes ({done} of "
                                         f"{done + len(todo) - len(receiver.done)} file(s) complete): {exc.message}",
                                         hint="run the same orch pull again: it asks only for what is still "
                                              "missing") from None
                notice(f"the link dropped after {received} of {total} bytes ({exc.message}); resuming")
                todo = [_resumed(dest, i) for i in todo if i.key not in receiver.done and i.key not in receiver.failed]
                failed += receiver.failed
            finally:
                receiver.close()
    failed += receiver.failed
    if failed:
        _write_cache(dest, known)
        raise InputError(f"{len(failed)} file(s) changed on the target while they were pulled: "
                         + ", ".join(failed[:8]), hint="pull again once the run has stopped writing them")
    return received + receiver.received


def _resumed(dest: Path, item: Item) -> Item:
    """``item`` asked again from the length its part has now."""
    try:
        have = os.path.getsize(part_path(dest / item.key))
    except OSError:
        have = 0
    return Item(item.key, item.size, "resume" if 0 < have <= item.size else item.action,
                offset=have if 0 < have <= item.size else 0, sha256=item.sha256, entry=item.entry)

ENTRY_SHAPE = r"\d{8}T\d{6}Z-[A-Za-z0-9_.:-]+"  # a trash entry's name: the time it was made, then its label


def selection(checkpoints: str | None, *, want_checkpoints: bool, outputs: bool, log: bool, words: list[str]) \
        -> Selection:
    """The selection the command line names, checked before anything is reached: ``words`` are GLOBs, and with
    ``--checkpoints`` the one that has a trash entry's shape is the ENTRY. Nothing named: all three sources."""
    import re

    from ..agent.serving.validate import pull_glob, trash_name

    entries = [w for w in words if want_checkpoints and re.fullmatch(ENTRY_SHAPE, w)]
    if len(entries) > 1:
        raise InputError(f"--checkpoints takes one trash entry, and {len(entries)} were named: {', '.join(entries)}",
                         hint="pull one entry at a time (see orch checkpoints list)")
    globs = [w for w in words if w not in entries]
    try:
        entry = trash_name(entries[0]) if entries else None
        for g in globs:
            pull_glob(g)
    except AgentFailure as exc:
        raise InputError(exc.message.replace("glob ", "GLOB ", 1),
                         hint="a GLOB is a pattern over the paths pulled, e.g. '*.pt' or 'out/*.json'") from None
    if not (want_checkpoints or outputs or log):
        want_checkpoints, outputs, log = bool(checkpoints), True, True
    if want_checkpoints and not checkpoints:
        raise InputError("the run has no checkpoint folder to pull from",
                         hint="set [paths] checkpoints in orch.toml, or pull --outputs / --log only")
    return Selection(checkpoints=checkpoints if want_checkpoints else None, entry=entry, outputs=outputs, log=log,
                     globs=globs)
