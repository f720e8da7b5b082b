"""Garbage collection of a target root: revisions, blobs and run folders nothing needs any more.

Conservative by construction, and run under the target lock (no launch interleaves with it):

* a run folder goes only if it is ``project``'s, not alive, and not among the project's last ``keep`` runs;
  other projects' runs are never removed;
* a revision stays while a kept run (of ANY project) or ``keep_revisions`` (the controller's registry)
  names it, while it is younger than ``grace``, or while it holds files its manifest does not list
  (a run may have written checkpoints into its working folder);
* a blob (and its executable twin ``<sha>.x``) stays while a kept revision's manifest lists it, or while it is
  younger than ``grace`` (a push outside the lock may be about to assemble it); leftovers of cut pushes
  (``.part-*``, ``.ready-*``, ``.tmp-*``) go once older than ``grace``;
* nothing that is, or holds, a checkpoint folder a run names is ever removed; the trash lives beside those.

``freed`` counts each inode once, and only when every link to it goes: revision files are hard links to blobs.

    gc(layout, project="tinylm", keep=5, dry_run=True)
    -> {"items": [{"kind": "revision", "name": "0123…", "bytes": 4096, ...}], "freed": 123456, ...}
"""

from __future__ import annotations

import os
import shutil
import stat
import time

from . import journal
from .layout import Layout, read_json
from .runs import _runs, run_state

GRACE = 3600.0
STALE_PREFIXES = (".part-", ".ready-", ".tmp-")
MANIFEST = ".orch-manifest.json"


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
    revision = exp.get("revision") or (os.path.basename(str(launch.get("cwd") or "")) or None)
    project = exp.get("project")
    if project is None and journal.only_journal(run_dir):  # a launch that never started: its journal names it
        project = next((e.get("project") for e in journal.read(run_dir) if e["event"] == "begin"), None)
    return {"project": project, "revision": revision, "checkpoints": exp.get("checkpoints")}


def _manifest_paths(rev_dir: str) -> tuple[set | None, set]:
    """The blob hashes a revision's manifest lists, and its relative file paths (None: no readable manifest)."""
    data = read_json(os.path.join(rev_dir, MANIFEST))
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        return None, set()
    files = [f for f in data["files"] if isinstance(f, dict)]
    return {str(f.get("sha256")) for f in files}, {str(f.get("path")) for f in files}


def _foreign_files(rev_dir: str, listed: set) -> int:
    """Files under a revision folder that its manifest does not list (outputs a run wrote there)."""
    count = 0
    for base, _dirs, files in os.walk(rev_dir):
        for name in files:
            rel = os.path.relpath(os.path.join(base, name), rev_dir)
            if rel != MANIFEST and rel not in listed:
                count += 1
    return count


def _holds(path: str, protected: list[str]) -> bool:
    real = os.path.realpath(path)
    return any(p == real or p.startswith(real + os.sep) for p in protected)


def plan(layout: Layout, project: str, keep: int = 5, keep_revisions: list | None = None,
         checkpoints: list | None = None, grace: float = GRACE) -> dict:
    """What a collection would remove, and why the rest stays; touches nothing."""
    now = time.time()
    runs = [(exp_id, d, _run_info(d)) for _when, exp_id, d in _runs(layout)]
    mine = [r for r in runs if r[2]["project"] == project]
    recent = {d for _e, d, _i in mine[-keep:]} if keep > 0 else set()  # by folder: numbers repeat across clones
    doomed_runs, kept_runs = [], []
    for exp_id, run_dir, info in runs:
        if info["project"] == project and run_dir not in recent \
                and run_state(run_dir)["state"] not in ("running", "launching"):
            doomed_runs.append((exp_id, run_dir, info))
        else:
            kept_runs.append((exp_id, run_dir, info))
    protected = [os.path.realpath(str(p)) for p in
                 [i["checkpoints"] for _e, _d, i in runs] + list(checkpoints or []) if p]
    protected += [p + ".trash" for p in protected]
    used = {i["revision"] for _e, _d, i in kept_runs if i["revision"]} | set(keep_revisions or [])
    items, kept = [], []
    for exp_id, run_dir, _info in doomed_runs:
        if _holds(run_dir, protected):
            kept.append({"kind": "run", "name": str(exp_id), "why": "holds a checkpoint folder"})
        else:
            items.append({"kind": "run", "name": str(exp_id), "path": run_dir})
    needed: set = set()
    blobs_safe = True
    for name in sorted(_listdir(layout.revisions)):
        rev_dir = os.path.join(layout.revisions, name)
        if name.startswith(STALE_PREFIXES):
            if now - _newest(rev_dir) > grace:
                items.append({"kind": "stale", "name": f"revisions/{name}", "path": rev_dir})
            continue
        hashes, listed = _manifest_paths(rev_dir)
        why = None
        if name in used:
            why = "used by a kept run"
        elif now - _newest(rev_dir) <= grace:
            why = "younger than the grace period"
        elif hashes is None:
            why = "no readable manifest"
        elif _foreign_files(rev_dir, listed):
            why = "holds files its manifest does not list (a run's outputs?)"
        elif _holds(rev_dir, protected):
            why = "holds a checkpoint folder"
        if why is None:
            items.append({"kind": "revision", "name": name, "path": rev_dir})
            continue
        kept.append({"kind": "revision", "name": name, "why": why})
        if hashes is None:
            blobs_safe = False  # a kept revision whose blobs we cannot tell: keep every blob
        else:
            needed |= hashes
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
        if len(sha) != 64 or sha in needed or not blobs_safe or age <= grace:
            continue
        items.append({"kind": "blob", "name": name, "path": path})
    return _sized(items, kept)


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


def gc(layout: Layout, project: str, keep: int = 5, keep_revisions: list | None = None,
       checkpoints: list | None = None, dry_run: bool = True, grace: float = GRACE, only: list | None = None) -> dict:
    """Plan, then (unless ``dry_run``) remove the planned items: runs, revisions, then blobs.

    ``only`` ("kind:name" strings, from a plan the user confirmed) limits removal to what was shown.
    """
    result = plan(layout, project, keep, keep_revisions, checkpoints, grace)
    if only is not None:
        wanted = set(only)
        items = [i for i in result["items"] if f"{i['kind']}:{i['name']}" in wanted]
        result = _sized([{"kind": i["kind"], "name": i["name"], "path": i["path"]} for i in items], result["kept"])
    result["dry_run"] = dry_run
    if dry_run:
        return result
    for item in result["items"]:
        path = item["path"]
        if os.path.isdir(path) and not os.path.islink(path):
            _make_writable(path)
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)
    return result


def _make_writable(top: str) -> None:
    """Revision folders may hold read-only subfolders; their entries must be removable."""
    for base, dirs, _files in os.walk(top):
        for d in [base] + [os.path.join(base, n) for n in dirs]:
            try:
                st = os.lstat(d)
                if not os.path.islink(d) and not st.st_mode & 0o200:
                    os.chmod(d, st.st_mode | 0o700)
            except OSError:
                continue
