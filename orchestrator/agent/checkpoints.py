"""Checkpoint folders, handled so that nothing is lost by accident.

Cleaning moves a checkpoint folder's contents into ``<checkpoints>.trash/<time>-exp<id>/`` beside it:
a rename on the same filesystem, instant even for hundreds of GB, and undone by ``restore``. Only
``purge`` deletes, and only inside that trash folder. Every entry point first runs ``check_path``.
"""

from __future__ import annotations

import os
import shutil
import time

from .layout import Layout, read_json, write_json
from .protocol import AgentFailure
from .runs import alive_runs

# folders whose contents are never checkpoints: refusing them (and everything in the system ones)
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run", "/sbin",
                "/sys", "/usr", "/var/lib", "/var/log", "/var/cache", "/var/spool", "/snap")
EXACT = ("/", "/home", "/root", "/tmp", "/var", "/opt", "/srv", "/mnt", "/media", "/workspace", "/data")
META = ".orch-trash.json"


def trash_dir(path: str) -> str:
    return os.path.normpath(path) + ".trash"


def check_path(layout: Layout, path: str, configured: str, stopping: list | None = None,
               busy_check: bool = True) -> str:
    """Refuse, touching nothing, any checkpoint path that is unsafe to move or delete from."""
    if not path or not str(path).strip():
        raise AgentFailure("safety", "the checkpoint path is empty", "set [paths] checkpoints to a folder")
    if not os.path.isabs(path):
        raise AgentFailure("safety", f"the checkpoint path {path!r} is not absolute",
                           "set [paths] checkpoints to an absolute folder")
    norm = os.path.normpath(path)
    if norm != os.path.normpath(configured):
        raise AgentFailure("safety", f"{norm} is not the checkpoint folder the configuration names ({configured})",
                           "orch only moves files in the configured checkpoint folder")
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


def _tree(path: str) -> tuple[list, int, float | None, str | None]:
    files, total, newest, newest_name = [], 0, None, None
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
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


def inventory(layout: Layout, path: str, configured: str) -> dict:
    """What the folder holds now, and what its trash holds."""
    norm = check_path(layout, path, configured, busy_check=False)
    files, total, newest, newest_name = _tree(norm) if os.path.isdir(norm) else ([], 0, None, None)
    entries = []
    tdir = trash_dir(norm)
    if os.path.isdir(tdir):
        for name in sorted(os.listdir(tdir)):
            full = os.path.join(tdir, name)
            if os.path.isdir(full):
                efiles, etotal, _, _ = _tree(full)
                meta = read_json(os.path.join(full, META), {}) or {}
                entries.append({"name": name, "files": len(efiles) - (1 if meta else 0), "bytes": etotal,
                                "created": meta.get("created"), "experiment": meta.get("experiment"),
                                "moved_by": meta.get("moved_by")})
    return {"path": norm, "files": len(files), "bytes": total, "newest": newest_name, "newest_mtime": newest,
            "listing": files[:200], "trash": tdir, "entries": entries}


def move_to_trash(layout: Layout, path: str, configured: str, label: str, stopping: list | None = None,
                  keep: int | None = None, max_bytes: int | None = None, purge: bool = False,
                  moved_by: int | None = None) -> dict:
    """Rename every child of the folder into a new trash entry (nothing copied, nothing deleted).

    With ``purge`` (the user's explicit, confirmed ``--purge``) the new entry is then deleted.
    """
    norm = check_path(layout, path, configured, stopping)
    if not os.path.isdir(norm) or not os.listdir(norm):
        return {"action": "kept", "moved": 0, "entry": None}
    files, total, _, _ = _tree(norm)
    tdir = trash_dir(norm)
    os.makedirs(tdir, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    entry = os.path.join(tdir, f"{stamp}-{label}")
    n = 1
    while os.path.exists(entry):
        n += 1
        entry = os.path.join(tdir, f"{stamp}-{label}-{n}")
    os.mkdir(entry)
    children = sorted(os.listdir(norm))
    write_json(os.path.join(entry, META), {"source": norm, "children": children, "created": time.time(),
                                          "experiment": label, "moved_by": moved_by, "files": len(files),
                                          "bytes": total})
    for child in children:
        os.rename(os.path.join(norm, child), os.path.join(entry, child))
    if purge:
        shutil.rmtree(entry)
        return {"action": "purged", "moved": len(files), "bytes": total, "entry": None, "purged": []}
    purged = apply_retention(norm, keep, max_bytes, protect=os.path.basename(entry))
    return {"action": "moved", "moved": len(files), "bytes": total, "entry": os.path.basename(entry),
            "entry_path": entry, "purged": purged}


def _entry(norm: str, name: str) -> str:
    if not name or "/" in name or name in (".", ".."):
        raise AgentFailure("input", f"{name!r} is not a trash entry name", "see orch checkpoints list")
    full = os.path.join(trash_dir(norm), name)
    if not os.path.isdir(full):
        raise AgentFailure("notfound", f"no trash entry {name!r} in {trash_dir(norm)}", "see orch checkpoints list")
    return full


def restore(layout: Layout, path: str, configured: str, name: str) -> dict:
    """Move an entry's files back; refuse rather than overwrite anything already there."""
    norm = check_path(layout, path, configured)
    full = _entry(norm, name)
    children = [c for c in sorted(os.listdir(full)) if c != META]
    os.makedirs(norm, exist_ok=True)
    clash = [c for c in children if os.path.lexists(os.path.join(norm, c))]
    if clash:
        raise AgentFailure("conflict", f"{len(clash)} name(s) from {name} already exist in {norm}: "
                           + ", ".join(clash[:5]), "move the current checkpoints to the trash first "
                           "(orch checkpoints clean) or restore into an empty folder")
    for child in children:
        os.rename(os.path.join(full, child), os.path.join(norm, child))
    if os.path.exists(os.path.join(full, META)):
        os.unlink(os.path.join(full, META))
    os.rmdir(full)
    return {"restored": len(children), "entry": name, "path": norm}


def purge(layout: Layout, path: str, configured: str, names: list) -> dict:
    """Really delete trash entries (only ever inside ``<checkpoints>.trash``)."""
    norm = check_path(layout, path, configured, busy_check=False)
    done = []
    for name in names:
        full = _entry(norm, name)
        _, total, _, _ = _tree(full)
        shutil.rmtree(full)
        done.append({"entry": name, "bytes": total})
    return {"purged": done}


def apply_retention(norm: str, keep: int | None, max_bytes: int | None, protect: str | None = None) -> list:
    """Purge the oldest trash entries beyond the configured count/size (only when configured)."""
    if keep is None and max_bytes is None:
        return []
    tdir = trash_dir(norm)
    names = sorted(n for n in os.listdir(tdir) if os.path.isdir(os.path.join(tdir, n)))
    sizes = {n: _tree(os.path.join(tdir, n))[1] for n in names}
    purged = []
    while names:
        over_count = keep is not None and len(names) > keep
        over_size = max_bytes is not None and sum(sizes[n] for n in names) > max_bytes
        if not (over_count or over_size) or names[0] == protect:
            break
        victim = names.pop(0)
        shutil.rmtree(os.path.join(tdir, victim))
        purged.append({"entry": victim, "bytes": sizes[victim]})
    return purged
