"""orch gpus: every GPU orch can see, where it is and who uses it."""

from __future__ import annotations

import typer

from . import common, render
from .common import CtsOpt, JsonOpt, TargetsOpt, TrustOpt


def gpus(ctx: typer.Context, target: TargetsOpt = None, ct: CtsOpt = None, as_json: JsonOpt = False,
         trust_new_host: TrustOpt = False) -> None:
    """One table of every GPU: each CT the Proxmox token sees (else each configured target), its memory,
    utilisation, temperature, power, and whether it is free, an orch experiment's, or another process's."""
    from ..reach.gpu_facts import machines

    from ..launch import scheduler

    settings = common.settings(ctx)
    if not scheduler.named(settings, target, ct).places:  # its scheduler's nodes, as Slurm counts their GPUs
        return _slurm_nodes(settings, common.target(settings, (target or [None])[0], None, trust=trust_new_host),
                            as_json)
    rows = machines(settings, lambda name, ct_: common.target(settings, name, ct_, trust=trust_new_host),
                    names=target, cts=ct)
    if as_json:
        render.print_json(rows)
        return
    if not rows:
        render.out("no machines to ask: configure a target or a [proxmox] section")
        return
    table = []
    for m in rows:
        if m["gpus"]:
            for g in m["gpus"]:
                table.append([m["where"], g["index"], g.get("name"), _memory(g), _pct(g.get("util")),
                              _unit(g.get("temperature_c"), " C"), _power(g), g["use"]])
            continue
        table.append([m["where"], "-", _passed(m), "-", "-", "-", "-", _why_none(m)])
    render.table(None, ["machine", "gpu", "name", "memory", "util", "temp", "power", "use"], table)


def _slurm_nodes(settings, tgt, as_json: bool) -> None:
    from ..launch import slurm

    found = slurm.nodes(settings, tgt)
    if as_json:
        render.print_json({"target_label": tgt.label, "nodes": found})
        return
    render.table(f"GPUs on {tgt.label}", ["node", "state", "partitions", "gpus", "in use", "jobs"],
                 [[n["node"], n["state"].lower(), n["partitions"], n["gpus"], n["gpus_used"],
                   ", ".join(f"{j['job_id']} {j['name']} ({j['user']})" for j in n["jobs"]) or "-"]
                  for n in found])


def _memory(g: dict) -> str:
    if g.get("mem_used_mib") is None or g.get("mem_total_mib") is None:
        return "-"
    return f"{g['mem_used_mib']}/{g['mem_total_mib']} MiB"


def _pct(value) -> str:
    return "-" if value is None else f"{value}%"


def _unit(value, unit: str) -> str:
    return "-" if value is None else f"{value}{unit}"


def _power(g: dict) -> str:
    if g.get("power_w") is None:
        return "-"
    limit = f"/{float(g['power_limit_w']):.0f}" if g.get("power_limit_w") is not None else ""
    return f"{float(g['power_w']):.0f}{limit} W"


def _passed(m: dict) -> str:
    """The passthrough config, the only thing known of a stopped CT's GPUs."""
    p = m.get("passthrough")
    if not p or not p["lines"]:
        return "no GPU passed through" if p is not None else "-"
    count = "?" if p["count"] is None else str(p["count"])
    return f"{count} passed through: " + ", ".join(f"/dev/nvidia{i}" for i in p["indices"]) if p["indices"] \
        else f"{count} passed through"


def _why_none(m: dict) -> str:
    if m.get("status") not in (None, "running"):
        return m["status"]
    if m.get("error"):
        return m["error"]
    return "no GPUs"


def register(app: typer.Typer) -> None:
    app.command()(gpus)
