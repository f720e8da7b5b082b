"""Where a command went the last time it was typed here, so that the next one's keeper can log in before the
command has loaded its settings.

A first command of the day (no keeper up) starts a keeper as it begins (``begin.prespawn``), but learns its
target only once typer, pydantic and orch.toml are loaded and the target resolved: ~0.3 s of CPU in which the keeper
waits. The same words typed in the same folder, with the same ``ORCH_*`` environment, an unchanged orch.toml and
the same current target, name the same connection as before; so each command that tells its keeper a connection
(``client.early``) notes it here, and the next one tells it at once::

    remember(argv, files, {"spec": ..., "agent": [...], "idle": 600.0})   # once the target is resolved
    recall(argv)          # as the next command begins: that dict, or None when anything it depends on changed

A recalled connection is only where the keeper logs in early: it is opened and checked as any keeper's
(strict host keys, the trust files' signature), and the command's own requests, with a CT's identity, go as
before; a command that resolves another connection asks for that one. The notes live in this user's private
runtime folder (``sockets.folder``), one small JSON file per orch version, at most ``KEEP`` of them.
"""

from __future__ import annotations

import hashlib
import json
import os

from ... import sockets

KEEP = 16  # commands remembered (the newest); a project's few command lines fit many times over
ENV = ("HOME",)  # beside every ORCH_* variable: what the settings' paths (~) depend on


def _file(digest: str) -> str:
    return os.path.join(sockets.folder_name(), f"targets-{digest}.json")


def _key(argv: list[str]) -> str:
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("ORCH_") or k in ENV)
    return hashlib.sha256(json.dumps([os.getcwd(), list(argv), env]).encode()).hexdigest()


def _hashes(files: list[str]) -> dict[str, str | None]:
    """Each file's content hash (None: missing or unreadable), as the settings were read from them."""
    out: dict[str, str | None] = {}
    for path in files:
        try:
            with open(path, "rb") as fh:
                out[path] = hashlib.sha256(fh.read(1 << 20)).hexdigest()
        except OSError:
            out[path] = None
    return out


def _load(digest: str) -> dict:
    try:
        with open(_file(digest), encoding="utf-8") as fh:
            notes = json.load(fh)
    except (OSError, ValueError):
        return {}
    return notes if isinstance(notes, dict) else {}


def recall(argv: list[str], digest: str) -> dict | None:
    """What ``remember`` noted for these words here, while every file it depended on is as it was then."""
    try:
        note = _load(digest).get(_key(argv))
    except (OSError, sockets.SafetyError):
        return None
    if not (isinstance(note, dict) and isinstance(note.get("files"), dict) and isinstance(note.get("told"), dict)):
        return None
    if _hashes(list(note["files"])) != note["files"]:
        return None
    told = note["told"]
    return told if isinstance(told.get("spec"), dict) else None


def remember(argv: list[str], digest: str, files: list[str], told: dict) -> None:
    """Note ``told`` (what the keeper was told to ready) for these words here, valid while ``files`` are
    unchanged. Written only when it differs from the note there (a rename: a reader never sees half of it)."""
    try:
        key = _key(argv)
        notes = _load(digest)
        note = {"files": _hashes(files), "told": told}
        if notes.get(key) == note:
            return
        notes.pop(key, None)
        notes[key] = note  # the newest last: the oldest go first
        for old in list(notes)[:-KEEP]:
            del notes[old]
        path = _file(digest)
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(notes, fh)
        os.replace(tmp, path)
    except (OSError, TypeError, ValueError, sockets.SafetyError):
        pass  # a note not written: the next command tells its keeper once it knows the target, as before
