"""Where keepers listen: one socket per keeper in this user's private folder (``sockets.folder``). A keeper
serves one home folder and one version of orch, so the socket name carries both: a new orch never talks to an
old keeper (the old one idles out), and two users never share one.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from ... import sockets

MODULE = "orchestrator.reach.keeper"  # what a keeper runs: python -m MODULE SOCKET IDLE_SECONDS


def code_digest() -> str:
    """A short hash of the keeper's and the SSH transport's code: a changed orch gets a keeper of its own. Made
    once a process, as this module loads (so the threads of `status --all` never each hash it again)."""
    if "digest" not in _CACHE:
        pkg = Path(__file__).resolve().parent.parent
        h = hashlib.sha256(sys.prefix.encode())  # the installation: its python and its SSH libraries
        top = pkg.parent
        for path in sorted([*(pkg / "keeper").glob("*.py"), *(pkg / "transport").glob("*.py"), top / "errors.py",
                            top / "sockets.py"]):
            h.update(path.read_bytes())
        _CACHE["digest"] = h.hexdigest()[:12]
    return _CACHE["digest"]


_CACHE: dict[str, str] = {}
try:
    code_digest()  # a process that loads this module ahead of its commands pays for it once
except OSError:
    pass  # said by the first command that needs it


def socket_path() -> Path:
    home = os.path.expanduser("~")
    name = hashlib.sha256(f"{home}\0{code_digest()}".encode()).hexdigest()[:12]
    return sockets.folder() / f"keeper-{name}{sockets.SUFFIX}"


def socket_paths() -> list[Path]:
    """Every keeper socket in this user's folder (keepers of other homes or versions too)."""
    return sorted(sockets.folder().glob(f"keeper-*{sockets.SUFFIX}"))
