"""paramiko, loaded once per process without invoke.

paramiko's ``config`` module imports invoke as it loads (``try: import invoke``), though it uses it only to run a
``Match exec`` line of an SSH config; invoke pulls in ``unittest.mock``, ``asyncio`` and its own YAML: about a third
of paramiko's import time, paid by every process that connects (the first command after a quiet spell, each
connection keeper). Every paramiko import in orch goes through ``paramiko()`` first, so paramiko loads with invoke
held back; ``with_invoke()`` gives paramiko invoke when an SSH config really has a ``Match exec``. Its version, which
paramiko asks of ``importlib.metadata`` as it loads, is read from its dist-info folder's name (``_versions_only``).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

_LOCK = threading.Lock()
_LOADED: list[Any] = []  # paramiko, once loaded


def paramiko() -> Any:
    """The paramiko module, loaded without invoke when this process has not loaded invoke already. Threads that
    connect at once (a job's nodes, ``status --all``) wait for the one load: none sees a half-loaded paramiko."""
    if _LOADED:
        return _LOADED[0]
    with _LOCK:
        if not _LOADED:
            _LOADED.append(_load())
    return _LOADED[0]


def _load() -> Any:
    held = "paramiko" not in sys.modules and "invoke" not in sys.modules
    if held:
        sys.modules["invoke"] = None  # type: ignore[assignment]  # an ImportError for ``import invoke``
    versions = "paramiko" not in sys.modules and "importlib.metadata" not in sys.modules
    if versions:
        sys.modules["importlib.metadata"] = _versions_only()
    try:
        import paramiko as module
    except ImportError:
        if not held:
            raise
        _forget("paramiko")  # a paramiko that needs invoke as it loads: load it as it is
        del sys.modules["invoke"]
        held = False
        import paramiko as module
    finally:
        if held and sys.modules.get("invoke", False) is None:
            del sys.modules["invoke"]
        if versions and getattr(sys.modules.get("importlib.metadata"), "versions_only", False):
            del sys.modules["importlib.metadata"]  # whoever asks next loads the real one
    return module


def _versions_only() -> Any:
    """What paramiko's ``__init__`` asks of ``importlib.metadata`` (its own ``version``), read from its
    ``*.dist-info`` folder's name: the real module loads ``email`` and walks every folder on sys.path (~30 ms of a
    keeper's start, before its login). Anything else it is asked, or no such folder, goes to the real one."""
    import types

    stub = types.ModuleType("importlib.metadata")
    stub.versions_only = True  # type: ignore[attr-defined]

    def real() -> Any:
        if sys.modules.get("importlib.metadata") is stub:
            del sys.modules["importlib.metadata"]
        import importlib.metadata

        return importlib.metadata

    def version(name: str) -> str:
        import glob
        import os

        home = getattr(sys.modules.get(name), "__file__", None)
        if home:
            found = glob.glob(os.path.join(os.path.dirname(os.path.dirname(home)), f"{name}-*.dist-info"))
            if len(found) == 1:
                return os.path.basename(found[0])[len(name) + 1:-len(".dist-info")]
        return real().version(name)

    stub.version = version  # type: ignore[attr-defined]
    stub.__getattr__ = lambda attr: getattr(real(), attr)  # type: ignore[attr-defined]
    return stub


def with_invoke() -> bool:
    """paramiko's SSH config parser given invoke (for ``Match exec``); False when invoke is not installed."""
    paramiko()
    try:
        import invoke
    except ImportError:
        return False
    from paramiko import config

    config.invoke = invoke
    return True


def _forget(package: str) -> None:
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[name]
