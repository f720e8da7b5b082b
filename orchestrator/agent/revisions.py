"""Content-addressed blobs and immutable revision folders on the target.

Blobs are stored read-only (0444). A revision's files are hard links to them, so assembling a revision
costs no copying however large the tree; executables link to a read-only 0555 twin of the blob
(``<sha>.x``). Revision files are therefore read-only, as an immutable revision should be.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from . import blob_stream, durability
from .layout import Layout, write_json
from .protocol import AgentFailure, manifest_id
from .validate import manifest


def _valid_sha(sha: str) -> bool:
    return len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)


def blobs_missing(layout: Layout, hashes: list) -> dict:
    """Which of ``hashes`` the target lacks: the controller sends only those."""
    layout.ensure()
    durability.recover(layout)  # blobs a reboot may have damaged before they were synced are sent again
    missing = [h for h in hashes if not (_valid_sha(h) and os.path.isfile(layout.blob(h)))]
    return {"missing": missing, "partial": blob_stream.partial_sizes(layout, missing)}


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


def revision_assemble(layout: Layout, revision: str, files: list | None = None) -> dict:
    """Build ``revisions/<id>`` from blobs in a temp folder, then rename it into place.

    A revision that exists is never touched again (a running experiment keeps its code). Without
    ``files`` the revision must already exist (a restart of an earlier revision).
    """
    final = layout.revision(revision)
    if os.path.isdir(final):
        return {"revision": revision, "path": final, "created": False}
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
        write_json(os.path.join(tmp, ".orch-manifest.json"), {"revision": revision, "files": files})
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, final)
        except OSError:
            if not os.path.isdir(final):  # lost a race to an identical revision: fine
                raise
            shutil.rmtree(tmp, ignore_errors=True)
            return {"revision": revision, "path": final, "created": False}
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"revision": revision, "path": final, "created": True}
