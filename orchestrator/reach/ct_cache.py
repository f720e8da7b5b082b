"""Proxmox lookups remembered, so a run of commands on one CT asks the API once, and the first command after a
pause does not wait for it.

A lookup (node, name, address, config summary) of a *running* CT is kept in the project's state folder; a
stopped or just-started CT is never kept. For ``[proxmox] cache_ttl`` seconds it is fresh: a command reaches the
CT without the API (or importing its client). After that, up to ``[proxmox] cache_max_age``, it is *stale*: still
used to reach the CT while the CT's port (or its node's, for ``pct``) answers, and asked again once the command
has answered (in the warm orch process), so the next command sees what changed. Any command that fails to reach
a target forgets what it was served (``forget_served``), so the next one asks the API again. The SSH host key at
that address is no proof that the machine there is still the CT (a clone has its original's keys): every agent
call checks the hostname and MAC addresses kept here, and the machine id seen there (``note``), and a machine that
is another makes orch ask the API again (``reach/identity.py``).

The file holds no secrets: addresses and names only, written 0600 like the rest of ``.orch``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..files import atomic_write

FILE = "ct-cache.json"
_served: list[tuple[Path, str]] = []  # (cache file, key) this process answered from: forgotten on failure


def _key(api: str, vmid: int, access: str) -> str:
    return f"{api}/{vmid}/{access}"


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(path: Path, data: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(data), mode=0o600)
    except OSError:  # a cache that cannot be written only costs the next command an API lookup
        pass


def lookup(state_dir: Path, api: str, vmid: int, access: str, ttl: float, now: float | None = None,
           max_age: float = 0.0) -> dict | None:
    """The remembered lookup of CT ``vmid`` reached by ``access``, if younger than ``ttl`` seconds (or, marked
    ``stale``, than ``max_age``); ``ttl`` 0: none."""
    if ttl <= 0:
        return None
    path, key = state_dir / FILE, _key(api, vmid, access)
    entry = _read(path).get(key)
    now = time.time() if now is None else now
    if not isinstance(entry, dict):
        return None
    age = now - float(entry.get("at", 0))
    if not 0 <= age < max(ttl, max_age):
        return None
    _served.append((path, key))
    return {**entry, "stale": age >= ttl}


def remember(state_dir: Path, api: str, vmid: int, access: str, ttl: float, info: dict,
             max_age: float = 0.0) -> None:
    """Keep the lookup of a running CT (or forget it, when the CT is not running); entries of other CTs older
    than ``max_age`` (or ``ttl``) are dropped on the way."""
    if ttl <= 0:
        return
    path, now, keep = state_dir / FILE, time.time(), max(ttl, max_age)
    data = {k: v for k, v in _read(path).items() if isinstance(v, dict) and now - float(v.get("at", 0)) < keep}
    key = _key(api, vmid, access)
    if info.get("status") != "running" or info.get("started"):
        if data.pop(key, None) is not None:
            _write(path, data)
        return
    seen = (data.get(key) or {}).get("machine_id")  # a lookup asked again is the same machine: forget() says not
    data[key] = {**({"machine_id": seen} if seen else {}), **info, "at": now}
    _write(path, data)


def note(state_dir: Path, api: str, vmid: int, access: str, **fields) -> None:
    """Add ``fields`` (the machine id an answer came from) to a remembered lookup, leaving its age as it is."""
    path, key = state_dir / FILE, _key(api, vmid, access)
    data = _read(path)
    entry = data.get(key)
    if isinstance(entry, dict) and any(entry.get(k) != v for k, v in fields.items()):
        entry.update(fields)
        _write(path, data)


def forget(state_dir: Path, api: str, vmid: int, access: str) -> None:
    """Drop the lookup of CT ``vmid`` (another machine answered at its address)."""
    path, key = state_dir / FILE, _key(api, vmid, access)
    data = _read(path)
    if data.pop(key, None) is not None:
        _write(path, data)


def forget_served() -> None:
    """Forget every lookup this process was served (it failed to reach a target)."""
    while _served:
        path, key = _served.pop()
        data = _read(path)
        if data.pop(key, None) is not None:
            _write(path, data)
