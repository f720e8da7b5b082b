"""Checkpoint folders, handled so that nothing is lost by accident.

Cleaning moves a checkpoint folder's contents into a trash entry ``<trash>/<time>-<label>/``: a rename on
the same filesystem, instant even for hundreds of GB, and undone by ``restore``. The trash is
``<checkpoints>.trash`` beside the folder, or ``<checkpoints>/.orch-trash`` when the folder is a mount
point (see ``trash_location``). Only ``purge`` deletes, and only trash entries. Every entry point first
runs ``check_path``; a clean also ``check_movable`` before anything is created or moved.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import time

from . import ckpt_layout
from ..layout import Layout, read_json, write_json
from ..protocol import AgentFailure
from ..run.runs import alive_runs
from .trash_location import check_movable, not_contents, trash_dir, trash_dirs

# folders whose contents are never checkpoints: refusing them (and everything in the system ones)
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run", "/sbin",
                "/sys", "/usr", "/var/lib", "/var/log", "/var/cache", "/var/spool", "/snap")
EXACT = ("/", "/home", "/root", "/tmp", "/var", "/opt", "/srv", "/mnt", "/media", "/workspace", "/data")
META = ".orch-trash.json"
NEW = "\uffff"
# what a training script writes on its way to a checkpoint, or hides: not checkpoints ([checkpoints] ignore)
IGNORE = (".*", "*.tmp", "*.tmp-*")  # sorts after every entry name: the entry a clean is about to make


def check_path(layout: Layout, path: str, configured: str, stopping: list | None = None,
               busy_check: bool = True) -> str:
    """Refuse, touching nothing, any checkpoint path that is unsafe to move or delete from."""
    if not path or not str(path).strip():
        raise AgentFailure("safety", "the checkpoint path is empty", "set [paths] checkpoints to a folder")
    if not os.path.isabs(path):
        raise AgentFailure("safety", f"the checkpoint path {path!r} is not absolute",
                           "set [paths] checkpoints to an absolute folder")
    norm = os.path.normpath(path)
    if norm != os.path.normpath(configured) and not ckpt_layout.is_variant_of(norm, configured):
        raise AgentFailure("safety", f"{norm} is not the checkpoint folder the configuration names ({configured})",
                           "orch only moves files in the configured checkpoint folder and its experiments' own")
    if norm in EXACT or any(norm == t or norm.startswith(t + "/") for t in SYSTEM_TREES):
        raise AgentFailure("safety", f"refusing to treat {norm} as a checkpoint folder: it is a system folder",
                           "point [paths] checkpoints at a folder of its own, e.g. /workspace/checkpoints")
    real = os.path.realpath(norm)
    if real != norm:
        raise AgentFailure("safety", f"{norm} resolves through a symlink to {real}",
                           f"set [paths] checkpoints to the real folder {real} if that is what you mean")
    owned = (layout.blobs, layout.revisions, layout.runs, os.path.join(layout.root, "agent"))
    if norm == layout.root or layout.root.startswith(norm + "/") or \
            any(norm == o or norm.startswith(o + "/") for o in owned):
        raise AgentFailure("safety", f"the checkpoint folder {norm} overlaps orch's own folders under {layout.root}",
                           "use a folder of its own, e.g. <root>/checkpoints or /workspace/checkpoints")
    if busy_check:
        stopping = set(stopping or [])
        for run in alive_runs(layout):
            if os.path.normpath(str(run.get("checkpoints") or "")) == norm and run["id"] not in stopping:
                raise AgentFailure("conflict", f"experiment {run['id']} is running and writes to {norm}",
                                   "stop it first (orch stop), or use orch restart --clean-checkpoints")
    return norm


def check(layout: Layout, path: str, configured: str, stopping: list | None = None, busy_check: bool = True,
          movable: bool = False) -> dict:
    """``check_path``; with ``movable``, also that a clean could rename the contents into the trash."""
    norm = check_path(layout, path, configured, stopping, busy_check)
    return {"path": norm, "trash": check_movable(norm) if movable else trash_dir(norm)}


def skipped(layout: Layout, norm: str) -> frozenset[str]:
    """The folder's children that are not its checkpoints: the trash and variant folders that may live inside it
    (and a volume's lost+found), and an older orch's variant folders not moved yet (``ckpt_layout``)."""
    return not_contents(norm) | ckpt_layout.legacy_names(layout, norm)


def _contents(layout: Layout, norm: str) -> list[str]:
    """The folder's children that are its checkpoints (``skipped`` left out)."""
    if not os.path.isdir(norm):
        return []
    skip = skipped(layout, norm)
    return sorted(c for c in os.listdir(norm) if c not in skip)


def ignored(name: str, patterns: tuple | list) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _tree(path: str, skip: frozenset[str] = frozenset(), ignore: tuple | list = ()) \
        -> tuple[list, int, float | None, str | None]:
    files, total, newest, newest_name = [], 0, None, None
    for dirpath, dirs, names in os.walk(path):
        if dirpath == path:
            dirs[:] = [d for d in dirs if d not in skip]
        dirs[:] = [d for d in dirs if not ignored(d, ignore)]
        for name in names:
            if ignored(name, ignore):
                continue
            full = os.path.join(dirpath, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            rel = os.path.relpath(full, path)
            files.append({"path": rel, "size": st.st_size, "mtime": st.st_mtime})
            total += st.st_size
            if newest is None or st.st_mtime > newest:
                newest, newest_name = st.st_mtime, rel
    return files, total, newest, newest_name


def _entries(norm: str) -> list[dict]:
    """Every trash entry of the folder, in both places a trash may be, oldest first (names start with the time)."""
    entries, seen = [], set()
    for tdir in trash_dirs(norm):
        if not os.path.isdir(tdir):
            continue
        for name in sorted(os.listdir(tdir)):
            full = os.path.join(tdir, name)
            if name not in seen and os.path.isdir(full) and not os.path.islink(full):
                seen.add(name)
                entries.append({"name": name, "path": full, "trash": tdir})
    return sorted(entries, key=lambda e: e["name"])


def trash_entries(norm: str) -> list[dict]:
    """The folder's trash entries, oldest first: ``{"name", "path", "trash"}`` each."""
    return _entries(norm)


def inventory(layout: Layout, path: str, configured: str, keep: int | None = None, max_bytes: int | None = None,
              full: bool = False, ignore: list | None = None) -> dict:
    """What the folder holds now, and what its trash holds.

    Hidden and temporary files (``ignore``, fnmatch patterns on names) are not counted as checkpoints.
    With ``keep``/``max_bytes``: ``retention``, the entries a clean now would delete (to be confirmed).
    With ``full``: ``all_files``, every file (ignored ones too), for a purge that must delete only what was
    confirmed.
    """
    norm = check_path(layout, path, configured, busy_check=False)
    ignore = IGNORE if ignore is None else tuple(ignore)
    found = os.path.isdir(norm)
    skip = skipped(layout, norm) if found else frozenset()
    files, total, newest, newest_name = _tree(norm, skip, ignore) if found else ([], 0, None, None)
    entries = []
    for entry in _entries(norm):
        efiles, etotal, _, _ = _tree(entry["path"])
        meta = read_json(os.path.join(entry["path"], META), {}) or {}
        entries.append({"name": entry["name"], "files": len(efiles) - (1 if meta else 0), "bytes": etotal,
                        "created": meta.get("created"), "experiment": meta.get("experiment"),
                        "moved_by": meta.get("moved_by"), "trash": entry["trash"]})
    out = {"path": norm, "files": len(files), "bytes": total, "newest": newest_name, "newest_mtime": newest,
           "listing": files[:200], "trash": trash_dir(norm),
           "trash_dirs": [d for d in trash_dirs(norm) if os.path.isdir(d)], "entries": entries,
           "variant_prefix": ckpt_layout.prefix(norm), "variants": _variants(norm, ignore)}
    if keep is not None or max_bytes is not None:
        sizes = [(e["name"], e["bytes"]) for e in entries] + ([(NEW, total)] if files else [])
        victims = retention_victims(sizes, keep, max_bytes, protect=NEW) if files else []
        out["retention"] = [{"entry": e["name"], "bytes": e["bytes"]} for e in entries if e["name"] in victims]
    if full:
        out["all_files"] = _tree(norm, skip)[0] if found else []
    return out


def _variants(norm: str, ignore: tuple) -> list[dict]:
    """The folders of the experiments that ran beside the lineage (``ckpt_layout``), what each holds."""
    out = []
    for v in ckpt_layout.variants(norm):
        files, total, _, newest = _tree(v["path"], not_contents(v["path"]), ignore)
        out.append({**v, "files": len(files), "bytes": total, "newest": newest})
    return out


def move_to_trash(layout: Layout, path: str, configured: str, label: str, stopping: list | None = None,
                  keep: int | None = None, max_bytes: int | None = None, purge: bool = False,
                  moved_by: int | None = None, retention_allowed: list | None = None,
                  purge_only: list | None = None) -> dict:
    """Rename every child of the folder into a new trash entry (nothing copied, nothing deleted).

    ``label`` names the entry (whose checkpoints these are); ``moved_by`` records the experiment that
    moved them. With ``purge`` (the user's explicit, confirmed ``--purge``) the new entry is then deleted;
    with ``purge_only`` (the confirmed inventory's ``all_files``) only the files listed there, unchanged,
    and whatever was written since (a final checkpoint of the stopped run) stays in the entry.
    ``retention_allowed`` limits the retention purge to the confirmed entries.
    """
    norm = check_path(layout, path, configured, stopping)
    if not _contents(layout, norm):
        return {"action": "kept", "moved": 0, "entry": None}
    tdir = check_movable(norm)
    files, total, _, _ = _tree(norm, skipped(layout, norm))
    os.makedirs(tdir, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    entry = os.path.join(tdir, f"{stamp}-{label}")
    n = 1
    while os.path.exists(entry):
        n += 1
        entry = os.path.join(tdir, f"{stamp}-{label}-{n}")
    os.mkdir(entry)
    children = _contents(layout, norm)
    write_json(os.path.join(entry, META), {"source": norm, "children": children, "created": time.time(),
                                          "experiment": label, "moved_by": moved_by, "files": len(files),
                                          "bytes": total})
    for child in children:
        os.rename(os.path.join(norm, child), os.path.join(entry, child))
    if purge:
        return _purge_new_entry(entry, files, total, purge_only)
    purged = apply_retention(norm, keep, max_bytes, protect=os.path.basename(entry), allowed=retention_allowed)
    return {"action": "moved", "moved": len(files), "bytes": total, "entry": os.path.basename(entry),
            "entry_path": entry, "purged": purged}


def _purge_new_entry(entry: str, files: list, total: int, only: list | None) -> dict:
    if only is None:
        shutil.rmtree(entry)
        return {"action": "purged", "moved": len(files), "bytes": total, "deleted": len(files), "entry": None,
                "purged": []}
    confirmed = {(f["path"], f["size"], f["mtime"]) for f in only}
    deleted, kept = 0, []
    for f in _tree(entry)[0]:  # what was really moved, which may be more than was confirmed
        if f["path"] == META:
            continue
        if (f["path"], f["size"], f["mtime"]) in confirmed:
            os.unlink(os.path.join(entry, f["path"]))
            deleted += 1
        else:
            kept.append(f["path"])
    for dirpath, _dirs, _names in os.walk(entry, topdown=False):
        if dirpath != entry and not os.listdir(dirpath):
            os.rmdir(dirpath)
    result = {"action": "purged", "moved": len(files), "bytes": total, "deleted": deleted, "kept": kept,
              "purged": []}
    if kept:  # not confirmed, so not deleted: restorable like any trash entry
        return {**result, "entry": os.path.basename(entry), "entry_path": entry}
    shutil.rmtree(entry)
    return {**result, "entry": None}


def _entry(norm: str, name: str) -> str:
    if not name or "/" in name or name in (".", ".."):
        raise AgentFailure("input", f"{name!r} is not a trash entry name", "see orch checkpoints list")
    for entry in _entries(norm):
        if entry["name"] == name:
            return entry["path"]
    raise AgentFailure("notfound", f"no trash entry {name!r} in {' or '.join(trash_dirs(norm))}",
                       "see orch checkpoints list")


def restore(layout: Layout, path: str, configured: str, name: str) -> dict:
    """Move an entry's files back; refuse rather than overwrite anything already there."""
    norm = check_path(layout, path, configured)
    full = _entry(norm, name)
    children = [c for c in sorted(os.listdir(full)) if c != META]
    os.makedirs(norm, exist_ok=True)
    clash = [c for c in children if os.path.lexists(os.path.join(norm, c))]
    if clash:
        raise AgentFailure("safety", f"{len(clash)} name(s) from {name} already exist in {norm}: "
                           + ", ".join(clash[:5]), "move the current checkpoints to the trash first "
                           "(orch checkpoints clean) or restore into an empty folder")
    for child in children:  # an entry from before the folder became a mount point is on another filesystem
        src, dst = os.path.join(full, child), os.path.join(norm, child)
        if os.stat(full).st_dev == os.stat(norm).st_dev:
            os.rename(src, dst)
        else:
            shutil.move(src, dst)  # copy, then delete the source: the entry keeps what is not copied yet
    if os.path.exists(os.path.join(full, META)):
        os.unlink(os.path.join(full, META))
    os.rmdir(full)
    return {"restored": len(children), "entry": name, "path": norm}


def purge(layout: Layout, path: str, configured: str, names: list) -> dict:
    """Really delete trash entries (only ever entries of the folder's trash)."""
    norm = check_path(layout, path, configured, busy_check=False)
    done = []
    for name in names:
        full = _entry(norm, name)
        _, total, _, _ = _tree(full)
        shutil.rmtree(full)
        done.append({"entry": name, "bytes": total})
    return {"purged": done}


def retention_victims(sizes: list[tuple[str, int]], keep: int | None, max_bytes: int | None,
                      protect: str | None = None) -> list[str]:
    """The oldest entries (by name, which starts with the time) beyond ``keep`` entries or ``max_bytes``."""
    names = sorted(n for n, _ in sizes)
    size = dict(sizes)
    victims = []
    while names:
        over_count = keep is not None and len(names) > keep
        over_size = max_bytes is not None and sum(size[n] for n in names) > max_bytes
        if not (over_count or over_size) or names[0] == protect:
            break
        victims.append(names.pop(0))
    return victims


def apply_retention(norm: str, keep: int | None, max_bytes: int | None, protect: str | None = None,
                    allowed: list | None = None) -> list:
    """Purge the oldest trash entries beyond the configured count/size (only when configured).

    With ``allowed`` (the entries the user confirmed) nothing else is deleted, even if now due.
    """
    if keep is None and max_bytes is None:
        return []
    paths = {e["name"]: e["path"] for e in _entries(norm)}
    sizes = {n: _tree(p)[1] for n, p in paths.items()}
    purged = []
    for victim in retention_victims(list(sizes.items()), keep, max_bytes, protect):
        if allowed is None or victim in allowed:
            shutil.rmtree(paths[victim])
            purged.append({"entry": victim, "bytes": sizes[victim]})
    return purged


def entry_path(norm: str, name: str) -> str:
    """The folder of trash entry ``name`` of the checkpoint folder ``norm``; refused when there is none."""
    return _entry(norm, name)
