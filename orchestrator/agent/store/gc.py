"""Garbage collection of a target root: revisions, blobs and run folders nothing needs any more.

Conservative by construction, and run under the target lock (no launch interleaves with it):

* a run folder goes only if it is ``project``'s, not alive, and not among the project's last ``keep`` runs;
  other projects' runs are never removed;
* a revision stays while a kept run (of ANY project) or ``keep_revisions`` (the controller's registry)
  names it, while it is younger than ``grace``, or while it holds files its manifest does not list (an older
  orch ran runs in it, and their outputs may be there; bytecode caches alone do not keep it);
* every revision is audited (``revisions.audit``): a file changed in place (a root run wrote into a hard link
  of it) is reported in ``changed``, its blob leaves the store and a ``.changed-<id>`` marker is left beside
  the revision: the next deploy of it sends the file again and rebuilds it, a restart of it is refused;
* a blob (and its executable twin ``<sha>.x``) stays while a kept revision's manifest lists it, or while it is
  younger than ``grace`` (a push outside the lock may be about to assemble it); leftovers of cut pushes
  (``.part-*``, ``.ready-*``, ``.tmp-*``) go once older than ``grace``;
* an env (``envs/<hash>``, ``envs.py``) stays while a kept run started in it, while ``keep_envs`` (the
  controller's registry) names it, or while it is younger than ``grace``; the wheels it was built from stay
  with it; a build that was cut (a store folder no link names) goes once older than ``grace``;
* nothing that is, or holds, a checkpoint folder a run names is ever removed; the trash lives beside those.

``freed`` counts each inode once, and only when every link to it goes: revision files are hard links to blobs.

    gc(layout, project="tinylm", keep=5, dry_run=True)
    -> {"items": [{"kind": "revision", "name": "0123…", "bytes": 4096, ...}], "freed": 123456,
        "kept": [{"kind": "revision", "name": "4567…", "why": "used by experiment 14 (running)"}], ...}
"""

from __future__ import annotations

import os
import stat
import time

from .. import journal
from . import envs, revisions
from ..layout import Layout, read_json, remove_tree, write_json
from ..run.runs import _runs, run_state

GRACE = 3600.0
STALE_PREFIXES = (".part-", ".ready-", ".tmp-")


def _walk(path: str):
    """(path, lstat) of ``path`` and everything under it, symlinks not followed."""
    try:
        st = os.lstat(path)
    except OSError:
        return
    yield path, st
    if os.path.isdir(path) and not os.path.islink(path):
        for base, dirs, files in os.walk(path):
            for name in dirs + files:
                full = os.path.join(base, name)
                try:
                    yield full, os.lstat(full)
                except OSError:
                    continue


def _newest(path: str) -> float:
    return max((st.st_mtime for _p, st in _walk(path)), default=0.0)


def _run_info(run_dir: str) -> dict:
    exp = read_json(os.path.join(run_dir, "experiment.json"), {}) or {}
    launch = read_json(os.path.join(run_dir, "launch.json"), {}) or {}
    revision = exp.get("revision") or launch.get("revision")
    cwd = str(launch.get("cwd") or "")
    if not revision and os.path.basename(os.path.dirname(cwd)) == "revisions":  # an older orch ran in it
        revision = os.path.basename(cwd)
    project = exp.get("project")
    if project is None and journal.only_launch(run_dir):  # a launch that never started: its journal names it
        project = next((e.get("project") for e in journal.read(run_dir) if e["event"] == "begin"), None)
    venv = str((launch.get("env") or {}).get("VIRTUAL_ENV") or "")
    return {"project": project, "revision": revision, "checkpoints": exp.get("checkpoints"),
            "env": os.path.basename(venv.rstrip("/")) or None}


def _holds(path: str, protected: list[str]) -> bool:
    real = os.path.realpath(path)
    return any(p == real or p.startswith(real + os.sep) for p in protected)


def _user(exp_id: int, state: str, project: str | None, mine: str) -> str:
    return f"{exp_id}{'' if project == mine else f' of project {project}'} ({state})"


def _used_why(users: list[str], by_registry: bool, keep: int) -> str | None:
    if users:
        return f"used by experiment{'s' if len(users) > 1 else ''} {', '.join(users)}"
    if by_registry:
        return f"used by one of this project's last {keep} experiments in the registry"
    return None


def _foreign_why(found: dict, rev_dir: str) -> str | None:
    """Files an older orch let a run write into the revision (its outputs): never removed, said with a remedy."""
    if not found["foreign"]:
        return None
    shown = ", ".join(found["foreign"][:3]) + (", …" if len(found["foreign"]) > 3 else "")
    return (f"holds {len(found['foreign'])} file(s) its manifest does not list ({shown}), written there by a run "
            f"of an older orch; move what you need out of {rev_dir}, then run orch gc again")


def plan(layout: Layout, project: str, keep: int = 5, keep_revisions: list | None = None,
         checkpoints: list | None = None, grace: float = GRACE, keep_envs: list | None = None) -> dict:
    """What a collection would remove, and why the rest stays; touches nothing."""
    now = time.time()
    runs = [(exp_id, d, _run_info(d)) for _when, exp_id, d in _runs(layout)]
    mine = [r for r in runs if r[2]["project"] == project]
    recent = {d for _e, d, _i in mine[-keep:]} if keep > 0 else set()  # by folder: numbers repeat across clones
    doomed_runs, kept_runs, kept = [], [], []
    for exp_id, run_dir, info in runs:
        state = run_state(run_dir)["state"]
        if info["project"] == project and run_dir not in recent and state not in ("running", "launching"):
            doomed_runs.append((exp_id, run_dir, info))
            continue
        kept_runs.append((exp_id, run_dir, info, state))
        if info["project"] == project:
            why = state if state in ("running", "launching") else \
                f"one of the last {keep} experiments" if keep > 1 else "the latest experiment"
            kept.append({"kind": "run", "name": str(exp_id), "why": why})
    protected = [os.path.realpath(str(p)) for p in
                 [i["checkpoints"] for _e, _d, i in runs] + list(checkpoints or []) if p]
    protected += [p + ".trash" for p in protected]
    users: dict = {}
    for exp_id, _d, info, state in kept_runs:
        if info["revision"]:
            users.setdefault(info["revision"], []).append(_user(exp_id, state, info["project"], project))
    by_registry = set(keep_revisions or [])
    items, changed = [], []
    for exp_id, run_dir, _info in doomed_runs:
        if _holds(run_dir, protected):
            kept.insert(0, {"kind": "run", "name": str(exp_id), "why": "holds a checkpoint folder"})
        else:
            items.append({"kind": "run", "name": str(exp_id), "path": run_dir})
    needed: set = set()
    blobs_safe = True
    untrusted: dict = {}  # blob name -> the inodes found changed: no longer what the name says
    for name in sorted(_listdir(layout.revisions)):
        rev_dir = os.path.join(layout.revisions, name)
        if name.startswith(STALE_PREFIXES):
            if now - _newest(rev_dir) > grace:
                items.append({"kind": "stale", "name": f"revisions/{name}", "path": rev_dir})
            continue
        if name.startswith(revisions.CHANGED):  # a marker gc wrote; it goes with its revision
            if not os.path.isdir(os.path.join(layout.revisions, name[len(revisions.CHANGED):])):
                items.append({"kind": "stale", "name": f"revisions/{name}", "path": rev_dir})
            continue
        files = revisions.listed_files(rev_dir)
        found = revisions.audit(rev_dir, files) if files is not None else None
        for bad in (found or {}).get("changed", []):
            entry = next(f for f in files if f["path"] == bad["path"])
            blob = str(entry.get("sha256")) + (".x" if int(entry.get("mode", 0)) & 0o111 else "")
            changed.append({"revision": name, "path": bad["path"], "why": bad["why"], "blob": blob})
            untrusted.setdefault(blob, set()).add(_inode(os.path.join(rev_dir, bad["path"])))
        why = (_used_why(users.get(name, []), name in by_registry, keep)
               or ("younger than the grace period" if now - _newest(rev_dir) <= grace else None)
               or ("no readable manifest" if files is None else None)
               or _foreign_why(found, rev_dir)
               or ("holds a checkpoint folder" if _holds(rev_dir, protected) else None))
        if why is None:
            items.append({"kind": "revision", "name": name, "path": rev_dir})
            continue
        kept.append({"kind": "revision", "name": name, "why": why,
                     **({"changed": [c for c in changed if c["revision"] == name]} if found and found["changed"]
                        else {})})
        if files is None:
            blobs_safe = False  # a kept revision whose blobs we cannot tell: keep every blob
        else:
            needed |= {str(f.get("sha256")) for f in files}
    needed |= _envs(layout, kept_runs, set(keep_envs or []), project, now, grace, items, kept)
    kept_blobs = 0
    for name in sorted(_listdir(layout.blobs)):
        path = os.path.join(layout.blobs, name)
        try:
            age = now - os.lstat(path).st_mtime
        except OSError:
            continue
        if name.startswith(STALE_PREFIXES):
            if age > grace:
                items.append({"kind": "stale", "name": f"blobs/{name}", "path": path})
            continue
        sha = name[:-2] if name.endswith(".x") else name
        if _inode(path) in untrusted.get(name, ()):  # the next deploy sends it again (a fresh one is kept)
            items.append({"kind": "blob", "name": name, "path": path, "why": "changed in place"})
        elif len(sha) == 64 and (sha in needed or not blobs_safe or age <= grace):
            kept_blobs += 1
        elif len(sha) == 64:
            items.append({"kind": "blob", "name": name, "path": path})
    return {**_sized(items, kept), "changed": changed, "kept_blobs": kept_blobs}


def _inode(path: str) -> tuple | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


def _sized(items: list[dict], kept: list[dict]) -> dict:
    """Each item's apparent size, and the bytes removing all of them frees (an inode counts once, when its
    last link goes)."""
    links: dict = {}
    for item in items:
        total = 0
        for _path, st in _walk(item["path"]):
            if stat.S_ISDIR(st.st_mode):
                continue
            total += st.st_size
            seen = links.setdefault((st.st_dev, st.st_ino), [0, st.st_nlink, st.st_size])
            seen[0] += 1
        item["bytes"] = total
    freed = sum(size for count, nlink, size in links.values() if count >= nlink)
    return {"items": items, "kept": kept, "freed": freed}


def _envs(layout: Layout, kept_runs: list, by_registry: set, project: str, now: float, grace: float,
          items: list, kept: list) -> set:
    """Plan the envs: the unused ones go, with the store folders of cut builds; the blobs the kept ones need."""
    users: dict = {}
    for exp_id, _d, info, state in kept_runs:
        if info.get("env"):
            users.setdefault(info["env"], []).append(_user(exp_id, state, info["project"], project))
    needed: set = set()
    linked = set()
    for name in envs.built(layout):
        path = envs.path_of(layout, name)
        real = os.path.dirname(os.path.realpath(path))  # the store folder its link names (sized, removed)
        linked.add(real)
        info = read_json(os.path.join(path, envs.INFO), {}) or {}
        why = (_used_why(users.get(name, []), False, 0)
               or ("used by one of this project's kept experiments in the registry" if name in by_registry else None)
               or ("younger than the grace period" if now - _newest(path) <= grace else None))
        if why is None:
            items.append({"kind": "env", "name": name, "path": real})
        else:
            kept.append({"kind": "env", "name": name, "why": why})
            needed |= {str(w) for w in info.get("wheels") or []}
    store = os.path.join(envs.folder(layout), ".store")
    for name in sorted(_listdir(store)):
        path = os.path.join(store, name)
        if os.path.realpath(path) not in linked and now - _newest(path) > grace:
            items.append({"kind": "stale", "name": f"envs/.store/{name}", "path": path})
    return needed


def gc(layout: Layout, project: str, keep: int = 5, keep_revisions: list | None = None,
       checkpoints: list | None = None, dry_run: bool = True, grace: float = GRACE, only: list | None = None,
       keep_envs: list | None = None) -> dict:
    """Plan, then (unless ``dry_run``) remove the planned items: runs, revisions, then blobs.

    ``only`` ("kind:name" strings, from a plan the user confirmed) limits removal to what was shown.
    """
    result = plan(layout, project, keep, keep_revisions, checkpoints, grace, keep_envs)
    if only is not None:
        wanted = set(only)
        items = [i for i in result["items"] if f"{i['kind']}:{i['name']}" in wanted]
        result = {**_sized([{k: i[k] for k in ("kind", "name", "path", "why") if k in i} for i in items],
                           result["kept"]), "changed": result["changed"], "kept_blobs": result["kept_blobs"]}
    result["dry_run"] = dry_run
    if dry_run:
        return result
    for item in result["items"]:
        if item["kind"] == "env":  # its link first: nothing starts in it while it goes
            envs.remove(layout, item["name"])
            continue
        remove_tree(layout.root, item["path"])
        if item["kind"] == "revision" and os.path.lexists(revisions.changed_marker(layout, item["name"])):
            os.unlink(revisions.changed_marker(layout, item["name"]))
    for rev in sorted({c["revision"] for c in result["changed"]}):
        if os.path.isdir(layout.revision(rev)):  # its next deploy rebuilds it; a restart of it is refused
            write_json(revisions.changed_marker(layout, rev),
                       sorted(c["path"] for c in result["changed"] if c["revision"] == rev))
    return result
