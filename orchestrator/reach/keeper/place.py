"""Where keepers listen: a 0700 folder of this user's (``$XDG_RUNTIME_DIR/orch``, else ``/tmp/orch-<uid>``),
one socket per keeper. A keeper serves one home folder and one version of orch, so the socket name carries both:
a new orch never talks to an old keeper (the old one idles out), and two users never share one.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from pathlib import Path

from ...errors import SafetyError

SUFFIX = ".sock"
MAX_FOLDER = 70


def folder() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if not os.path.isabs(runtime) or len(runtime) > MAX_FOLDER:  # a socket path has room for ~100 bytes
        runtime = ""
    base = Path(runtime) / "orch" if runtime else Path(f"/tmp/orch-{os.getuid()}")
    try:
        base.mkdir(mode=0o700, parents=runtime != "", exist_ok=True)
    except OSError as exc:
        raise SafetyError(f"cannot create the keeper folder {base}: {exc.strerror}",
                          hint="set [ssh] persist = 0 to connect directly, or fix XDG_RUNTIME_DIR") from exc
    info = base.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise SafetyError(f"the keeper folder {base} is not a private folder of this user (owner {info.st_uid}, "
                          f"mode {stat.S_IMODE(info.st_mode):o})",
                          hint="remove it (another user may have made it), or set [ssh] persist = 0")
    return base


def code_digest() -> str:
    """A short hash of the keeper's and the SSH transport's code: a changed orch gets a keeper of its own."""
    if "digest" not in _CACHE:
        pkg = Path(__file__).resolve().parent.parent
        h = hashlib.sha256(sys.prefix.encode())  # the installation: its python and its SSH libraries
        for path in sorted([*(pkg / "keeper").glob("*.py"), *(pkg / "transport").glob("*.py"), pkg.parent / "errors.py"]):
            h.update(path.read_bytes())
        _CACHE["digest"] = h.hexdigest()[:12]
    return _CACHE["digest"]


_CACHE: dict[str, str] = {}


def socket_path() -> Path:
    home = os.path.expanduser("~")
    name = hashlib.sha256(f"{home}\0{code_digest()}".encode()).hexdigest()[:12]
    return folder() / f"keeper-{name}{SUFFIX}"


def warm_socket_path() -> Path:
    """The warm orch process's socket: its name covers every file of the installed orch (names, sizes and
    times), so a changed orch never runs a command in a process that loaded the old one."""
    pkg = Path(__file__).resolve().parents[2]
    h = hashlib.sha256(f"{os.path.expanduser('~')}\0{sys.prefix}".encode())
    for where, dirs, files in os.walk(pkg):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith((".py", ".yaml")):
                st = os.stat(os.path.join(where, name))
                h.update(f"{where}/{name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return folder() / f"warm-{h.hexdigest()[:12]}{SUFFIX}"


def sockets() -> list[Path]:
    """Every keeper socket in this user's folder (keepers of other homes or versions too)."""
    return sorted(folder().glob(f"keeper-*{SUFFIX}"))
