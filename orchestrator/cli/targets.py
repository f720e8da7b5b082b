"""orch targets: the Proxmox containers the token can see, their GPUs, and where this project's runs are."""

from __future__ import annotations

import typer

from . import common, render
from .common import JsonOpt


def _gpus(row: dict) -> str:
    if row["gpus"] is None:
        return "yes (count unknown)" if row["gpu_devices"] else "?"
    return str(row["gpus"])


def targets(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """List the CTs the Proxmox token can see: id, name, node, status, address, GPUs, this project's runs."""
    from ..records.discovery import list_targets

    settings = common.settings(ctx)
    with common.registry(settings) as reg:
        rows = list_targets(settings, reg)
    if as_json:
        render.print_json(rows)
        return
    if not rows:
        render.out(f"the token {settings.proxmox.token_id} sees no containers")
        return
    render.table(None, ["ct", "name", "node", "status", "address", "gpus", f"runs of {settings.project.name}",
                        "entry"],
                 [[r["ct"], r["name"], r["node"], r["status"], r["address"] or r.get("error") or "-", _gpus(r),
                   (f"{len(r['runs'])} (latest {r['runs'][0]})" if r["runs"] else "-"),
                   ", ".join(r["entries"]) or "-"] for r in rows])


def register(app: typer.Typer) -> None:
    app.command()(targets)
