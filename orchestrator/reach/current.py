"""The project's current target: where bare commands act.

A successful ``deploy``/``restart`` given ``--ct``/``--target`` (or ``orch use``) records its choice in
``.orch/current-target.json`` beside the registry, so ``orch status``, ``logs``, ``restart``, ``stop``
and ``checkpoints`` without flags follow the run that was just started. A fresh clone has no such
file and starts from ``default_target``.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import InputError, OrchError
from ..files import atomic_write

FILE = "current-target.json"


def load(state_dir: Path) -> dict | None:
    """``{"target": NAME}``, ``{"ct": N}`` or ``{"nodes": [...]}`` (several), or None when nothing was chosen."""
    try:
        data = json.loads((state_dir / FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and isinstance(data.get("target"), str):
        return {"target": data["target"]}
    if isinstance(data, dict) and isinstance(data.get("ct"), int):
        return {"ct": data["ct"]}
    if isinstance(data, dict) and isinstance(data.get("nodes"), list) and data["nodes"]:
        return {"nodes": [n for n in data["nodes"] if isinstance(n, dict)]}
    return None


def save(state_dir: Path, name: str | None, ct: int | None, nodes: list[dict] | None = None) -> None:
    """Record the flags that named the target (atomically).

    ``nodes`` (``[{"ct": 200}, {"target": "gpu-b"}]``) records a job's nodes named by repeated flags.
    """
    data = {"nodes": nodes} if nodes else {"target": name} if name else {"ct": ct}
    text = json.dumps(data) + "\n"
    try:
        if (state_dir / FILE).read_text(encoding="utf-8") == text:
            return  # the target of the last launch again: the file says it already (no write, no disk sync)
    except (OSError, ValueError):
        pass
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        # whole or not at all, never synced: after a crash of the machine the file may be the one before (or
        # gone: bare commands then act on the default target, and the next --ct/--target records it again)
        atomic_write(state_dir / FILE, text, durable=False)
    except OSError as exc:
        raise OrchError(f"cannot record the current target in {state_dir / FILE}: {exc.strerror or exc}",
                        hint=f"free space in (or fix the permissions of) {state_dir}") from None


def acting_on(settings, name: str | None, ct: int | None, chosen: dict) -> tuple[str | None, int | None]:
    """The (--target, --ct) a command acts on: those given, else the current target ``chosen`` (``load``; after a
    job, its node 0), else the default (None, None)."""
    if name or ct is not None:
        return name, ct
    if chosen.get("nodes"):  # after a job over several nodes, a one-target command acts on node 0
        first = chosen["nodes"][0]
        return first.get("target"), first.get("ct")
    if chosen.get("target") is not None and chosen["target"] not in settings.targets:
        raise InputError(f"the current target {chosen['target']!r} is no longer in orch.toml",
                         hint="pass --target/--ct, or pick another with `orch use NAME` or `orch use --ct N`")
    return chosen.get("target"), chosen.get("ct")
