"""Which CTs the Proxmox token can see, and which of them hold this project's runs (``orch targets``).

The CT list comes from ``proxmox.list_cts``; the runs from the local registry, whose ``machine`` keys name the CT
and cluster a run went to (``ct:200@pve1.lan:/workspace/orch``). Old rows without one match by target name.
"""

from __future__ import annotations

import re

from ..config import Settings
from ..errors import InputError
from .experiments import Registry

MACHINE = re.compile(r"ct:(?P<ct>\d+)@(?P<cluster>[^:]*):")


def runs_by_ct(settings: Settings, registry: Registry) -> dict[int, list[int]]:
    """This project's experiment ids per CT of this cluster, newest first."""
    cluster = settings.proxmox.host if settings.proxmox else ""
    out: dict[int, list[int]] = {}
    for exp_id, machine, target in registry.places(settings.project.name):
        match = MACHINE.match(machine or "")
        if match and match["cluster"] == cluster:
            ct = int(match["ct"])
        elif not machine and target in settings.targets and settings.targets[target].ct is not None:
            ct = int(settings.targets[target].ct or 0)
        else:
            continue
        out.setdefault(ct, []).append(exp_id)
    return out


def list_targets(settings: Settings, registry: Registry) -> list[dict]:
    """One row per visible CT, with ``runs``: this project's experiment ids there, and the target entries naming it."""
    from ..reach import proxmox
    from ..reach.targets import proxmox_client

    if settings.proxmox is None:
        raise InputError("orch targets lists Proxmox containers, but orch.toml has no [proxmox] section",
                         hint="add [proxmox] host = \"...\" and token_id = \"user@realm!name\"")
    rows = proxmox.list_cts(proxmox_client(settings.proxmox))
    runs = runs_by_ct(settings, registry)
    for row in rows:
        row["runs"] = runs.get(row["ct"], [])
        row["entries"] = sorted(n for n, t in settings.targets.items() if t.kind == "proxmox" and t.ct == row["ct"])
    return rows
