"""Content-addressed blobs and immutable revision folders on the target.

Blobs are stored read-only (0444). A revision's files are hard links to them, so assembling a revision
costs no copying however large the tree; executables link to a read-only 0555 twin of the blob
(``<sha>.x``). Its folders are sealed read-only (0555) before it takes its name, so nothing adds a file to
it: runs work in a folder of their own (``workdir.py``). ``audit`` tells what changed in a revision since.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile

from . import blob_stream, durability
from ..layout import Layout, make_writable, read_json, remove_tree, write_atomic
from ..protocol import AgentFailure, manifest_id
from ..serving.validate import manifest


def _valid_sha(sha: str) -> bool:
    return len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)


def blobs_missing(layout: Layout, hashes: list, keys: list | None = None, sizes: list | None = None) -> dict:
    """Which of ``hashes`` the target lacks: the controller sends only those. For the files it has not hashed:
    the bytes kept of each of ``keys`` (a cut push's parts) and the stored blobs of each of ``sizes``."""
    layout.ensure()
    durability.recover(layout)  # blobs a reboot may have damaged before they were synced are sent again
    missing = [h for h in hashes if not (_valid_sha(h) and os.path.isfile(layout.blob(h)))]
    out = {"missing": missing, "partial": blob_stream.partial_sizes(layout, missing)}
    if keys:
        out["partial_keys"] = blob_stream.partial_sizes(layout, keys, keyed=True)
    if sizes:
        out["sized"] = blob_stream.sized(layout, sizes)
    return out


def _linked(layout: Layout, sha: str, mode: int) -> str:
    """The read-only blob file to link for ``mode``: the blob itself, or its executable twin."""
    blob = layout.blob(sha)
    if not mode & 0o111:
        return blob
    twin = blob + ".x"
    if not os.path.isfile(twin):
        fd, tmp = tempfile.mkstemp(dir=layout.blobs, prefix=".tmp-")
        os.close(fd)
        try:
            shutil.copyfile(blob, tmp)
            os.chmod(tmp, 0o555)
            os.replace(tmp, twin)
        except BaseException:  # a full disk: no half copy left behind
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    return twin


def blobs_store(layout: Layout, payload: "blob_stream.Payload | bytes", blobs: list) -> dict:
    """Store the streamed blobs, each verified against its hash before it becomes visible."""
    return blob_stream.store(layout, payload, blobs)


def _safe_rel(path: str) -> str:
    norm = os.path.normpath(path)
    if os.path.isabs(norm) or norm == "." or norm.startswith(".."):
        raise AgentFailure("input", f"manifest path {path!r} escapes the revision folder")
    return norm


MANIFEST = ".orch-manifest.json"
CHANGED = ".changed-"  # beside a revision: gc found it changed in place; the next deploy of it rebuilds it
CACHES = ("__pycache__",)  # what an older orch let runs write into a revision: regenerable, safe to drop


def _seal(top: str) -> None:
    """Every folder of a revision read-only (0555), deepest first; its files already are (links to blobs)."""
    for base, dirs, _files in os.walk(top, topdown=False):
        for d in dirs:
            os.chmod(os.path.join(base, d), 0o555)
    os.chmod(top, 0o555)


def _discard(tmp: str) -> None:
    make_writable(tmp)
    shutil.rmtree(tmp, ignore_errors=True)


def revision_assemble(layout: Layout, revision: str, files: list | None = None) -> dict:
    """Build ``revisions/<id>`` from blobs in a temp folder, then rename it into place.

    A revision that exists is never touched again (a running experiment keeps its code), unless gc found
    it changed in place: a deploy then rebuilds it, a restart is refused. Without ``files`` the revision
    must already exist (a restart of an earlier revision).
    """
    final = layout.revision(revision)
    changed = read_json(changed_marker(layout, revision))
    changed = None if changed is None else [str(p) for p in changed] if isinstance(changed, list) else []
    if os.path.isdir(final) and changed is None:
        return {"revision": revision, "path": final, "created": False}
    if os.path.isdir(final) and files is None:
        raise AgentFailure("safety", f"revision {revision} was changed in place on the target "
                           f"({', '.join(changed) or 'files'}, found by orch gc): not run again as it is",
                           "deploy again from the same code: its files are sent again and the revision rebuilt")
    if files is None:
        raise AgentFailure("notfound", f"revision {revision} is not on the target",
                           "deploy again to push it")
    manifest(files)  # blob names, paths and modes are checked before any becomes a file name
    if manifest_id(files) != revision:
        raise AgentFailure("input", f"the manifest does not hash to revision {revision}")
    missing = [f["sha256"] for f in files if not os.path.isfile(layout.blob(f["sha256"]))]
    if missing:
        raise AgentFailure("agent", f"{len(missing)} blob(s) of revision {revision} are missing on the target",
                           "deploy again; the missing files are re-sent")
    layout.ensure()
    if changed is not None and os.path.isdir(final):
        _retire(layout, revision, final)
    tmp = tempfile.mkdtemp(dir=layout.revisions, prefix=f".tmp-{revision}-")
    try:
        for f in files:
            rel = _safe_rel(f["path"])
            dest = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            source = _linked(layout, f["sha256"], int(f["mode"]))
            try:
                os.link(source, dest)
            except OSError:  # a filesystem without hard links: copy instead
                shutil.copyfile(source, dest)
                os.chmod(dest, os.stat(source).st_mode & 0o777)
        record = json.dumps({"revision": revision, "files": files}, indent=2, sort_keys=True) + "\n"
        write_atomic(os.path.join(tmp, MANIFEST), record.encode(), mode=0o444)
        _seal(tmp)
        try:
            os.rename(tmp, final)  # same parent: a read-only folder can be renamed
        except OSError:
            if not os.path.isdir(final):  # lost a race to an identical revision: fine
                raise
            _discard(tmp)
            return {"revision": revision, "path": final, "created": False}
    except BaseException:
        _discard(tmp)
        raise
    _unlink(changed_marker(layout, revision))
    return {"revision": revision, "path": final, "created": True}


def changed_marker(layout: Layout, revision: str) -> str:
    """``revisions/.changed-<id>``: gc found a file of that revision changed in place (a JSON list of paths)."""
    return os.path.join(layout.revisions, CHANGED + revision)


def _retire(layout: Layout, revision: str, final: str) -> None:
    """Take a changed revision out of the way of its rebuild; runs work in their own folders, so none needs it.
    One still holding what a run of an older orch wrote there is left for the user, and the deploy refused."""
    files = listed_files(final)
    found = audit(final, files) if files is not None else None
    if found is None or found["foreign"]:
        raise AgentFailure("safety", f"revision {revision} was changed in place and also holds files a run wrote "
                           f"there; it is not rebuilt over them", f"move what you need out of {final}, then remove "
                           "it and deploy again")
    remove_tree(layout.root, final)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def listed_files(rev_dir: str) -> list[dict] | None:
    """The manifest's entries of a revision folder (None: no readable manifest)."""
    data = read_json(os.path.join(rev_dir, MANIFEST))
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        return None
    return [f for f in data["files"] if isinstance(f, dict) and isinstance(f.get("path"), str)]


def audit(rev_dir: str, files: list[dict]) -> dict:
    """What differs in a revision folder from its manifest; a stat per file, a hash only of a suspect one.

    ``changed``: listed files whose content (or mode) is no longer what was pushed (a run running as root
    wrote into a hard link of it); ``foreign``: files the manifest does not list (an older orch ran runs in
    the revision folder), bytecode caches apart in ``caches``.
    A file is suspect when its size is not the manifest's, or it was modified after the manifest was written.
    """
    try:
        sealed_at = os.lstat(os.path.join(rev_dir, MANIFEST)).st_mtime_ns
    except OSError:
        sealed_at = 0
    listed = {f["path"]: f for f in files}
    changed = []
    for rel, entry in listed.items():
        path = os.path.join(rev_dir, rel)
        try:
            st = os.lstat(path)
        except OSError:
            changed.append({"path": rel, "why": "missing"})
            continue
        want = 0o555 if int(entry.get("mode", 0o644)) & 0o111 else 0o444
        if not stat.S_ISREG(st.st_mode):
            changed.append({"path": rel, "why": "no longer a file"})
        elif ("size" in entry and st.st_size != entry["size"]) or st.st_mtime_ns > sealed_at:
            if _sha256(path) != entry.get("sha256"):
                changed.append({"path": rel, "why": "content changed"})
        elif stat.S_IMODE(st.st_mode) != want:
            changed.append({"path": rel, "why": f"mode {oct(stat.S_IMODE(st.st_mode))}, not {oct(want)}"})
    foreign, caches = [], []
    for base, dirs, names in os.walk(rev_dir):
        rel_base = os.path.relpath(base, rev_dir)
        for d in [d for d in dirs if d in CACHES]:
            dirs.remove(d)
            caches.append(os.path.normpath(os.path.join(rel_base, d)))
        for name in names:
            rel = os.path.normpath(os.path.join(rel_base, name))
            if rel == MANIFEST or rel in listed:
                continue
            (caches if name.endswith((".pyc", ".pyo")) else foreign).append(rel)
    return {"changed": changed, "foreign": sorted(foreign), "caches": sorted(caches)}


def _sha256(path: str) -> str | None:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()
