"""StrictModes for orch's folders: nothing is run from a place another user could have written.

Like OpenSSH's StrictModes: the target root, its ``agent/`` folder and the agent files in it must be
owned by the user orch runs as (or root), not group- or world-writable, and not symlinks. The root's
ancestors are checked through their real path with the same rule, except that a root-owned sticky
folder (``/tmp``) is fine: nobody else can rename or replace what is ours in it. A symlink above the
root is followed only when root owns it (``/home -> /data/home`` set up by an administrator).

Used by the controller before it runs a local agent, and by the agent's bootstrap on every target
before it unpacks or imports anything. Stdlib only; ``problem()`` reports, the callers refuse.
"""

from __future__ import annotations

import json
import os
import stat
import zlib

FILES = "files.json"  # in the agent's zip: its other files' names and CRC-32s (``reach.agent_client`` writes it)
HINT = ("make it yours and not writable by others (chown, chmod go-w), or set the target's root to a "
        "folder of your own")


def _owner(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def describe(path: str, st: os.stat_result, why: str) -> str:
    return (f"refusing to run orch's agent from {path}: {why} (owner {_owner(st.st_uid)}, "
            f"mode {stat.S_IMODE(st.st_mode):04o})")


def _bad(path: str, st: os.stat_result, uid: int, sticky_ok: bool) -> str | None:
    if st.st_uid not in (uid, 0):
        return describe(path, st, f"it belongs to another user, not {_owner(uid)} or root")
    if st.st_mode & 0o022 and not (sticky_ok and st.st_uid == 0 and st.st_mode & stat.S_ISVTX):
        return describe(path, st, "it is writable by other users")
    return None


def problem(root: str, below: list[str] = (), uid: int | None = None) -> str | None:
    """Why ``root`` (and ``below``: paths under it, checked as far as they exist) is unsafe, or None.

    ``problem("/home/me/.local/share/orch/local", ["/home/me/.local/share/orch/local/agent"])`` -> None
    """
    if not os.path.isabs(root):
        return None  # not a root at all: the agent refuses it with an input error
    uid = os.getuid() if uid is None else uid
    root = os.path.normpath(root)
    parent = os.path.dirname(root)
    path = "/"
    for part in parent.split("/")[1:]:  # symlinks above the root: only an administrator's
        path = os.path.join(path, part)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            break
        if stat.S_ISLNK(st.st_mode) and st.st_uid != 0:
            return describe(path, st, "it is a symlink another user made")
    real = os.path.realpath(parent)
    path = "/"
    for part in ["", *real.split("/")[1:]]:
        path = os.path.join(path, part) if part else "/"
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None  # created by orch from here on
        why = _bad(path, st, uid, sticky_ok=True)
        if why:
            return why
    for path in [root, *below]:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(st.st_mode):
            return describe(path, st, "it is a symlink")
        why = _bad(path, st, uid, sticky_ok=False)
        if why:
            return why
    return None


def make_dirs(path: str) -> None:
    """``mkdir -p`` whose new folders are 0755 whatever the umask (0002 would make them refused)."""
    missing = []
    while not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o755)
        except FileExistsError:
            continue
        os.chmod(folder, 0o755)


def packed_files(zip_path: str) -> dict[str, int] | None:
    """The files of the agent's zip and their CRC-32s, from the list it carries (``FILES``, itself included), or None
    if it has none. Read through ``zipimport``, which the zip's bootstrap already runs from: the ``zipfile`` module
    would cost every agent call its imports (~5 ms); the list comes from the same zip, as trusted as its directory."""
    import zipimport

    try:
        data = zipimport.zipimporter(zip_path).get_data(FILES)
        listed = json.loads(data)
    except (OSError, ValueError, zipimport.ZipImportError):
        return None
    if not isinstance(listed, dict) or not all(isinstance(v, int) for v in listed.values()):
        return None
    return {**listed, FILES: zlib.crc32(data)}


def unpacked_problem(zip_path: str, folder: str, uid: int | None = None) -> str | None:
    """Why the unpacked copy ``folder`` differs from the zip it came from (files, owners, modes, CRCs)."""
    uid = os.getuid() if uid is None else uid
    expected = packed_files(zip_path)
    if expected is None:
        return f"{os.path.basename(zip_path)} lists no files ({FILES}): it is not an agent this orch made"
    found = set()
    for dirpath, dirs, files in os.walk(folder):
        cache = os.path.basename(dirpath) == "__pycache__"  # Python's own bytecode, written while others run
        for name in dirs + files:
            full = os.path.join(dirpath, name)
            try:
                st = os.lstat(full)
            except FileNotFoundError:  # a bytecode temp file another agent call just renamed
                continue
            if stat.S_ISLNK(st.st_mode):
                return describe(full, st, "it is a symlink")
            why = _bad(full, st, uid, sticky_ok=False)
            if why:
                return why
        for name in [] if cache else files:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, folder)
            with open(full, "rb") as fh:
                if expected.get(rel) != zlib.crc32(fh.read()):
                    return f"the unpacked agent {folder} does not match {os.path.basename(zip_path)}: {rel} differs"
            found.add(rel)
    if found != set(expected):
        return f"the unpacked agent {folder} does not match {os.path.basename(zip_path)}: files are missing"
    return None
