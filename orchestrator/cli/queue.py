"""orch queue [list] | remove ID: the experiments queued on a target (orch deploy --queue, orch sweep)."""

from __future__ import annotations

import typer

from . import common, render
from .common import CtOpt, IdArg, JsonOpt, TargetOpt, TrustOpt

app = typer.Typer(help="The experiments queued on a target: each starts when the one before it ends.")


@app.callback(invoke_without_command=True)
def queue(ctx: typer.Context, target: TargetOpt = None, ct: CtOpt = None, as_json: JsonOpt = False,
          trust_new_host: TrustOpt = False) -> None:
    """What is queued on the target, in order (orch queue list)."""
    if ctx.invoked_subcommand is None:
        list_(ctx, target, ct, as_json, trust_new_host)


@app.command("list")
def list_(ctx: typer.Context, target: TargetOpt = None, ct: CtOpt = None, as_json: JsonOpt = False,
          trust_new_host: TrustOpt = False) -> None:
    """What is queued on the target, in order; a queue nothing would start (after a reboot without systemd)
    is started first."""
    from ..launch import queueing, scheduler

    settings = common.settings(ctx)
    tgt = common.target(settings, target, ct, trust=trust_new_host)
    if scheduler.of(tgt).queues:  # the scheduler is the queue (Slurm): the project's pending jobs
        return _slurm_pending(settings, tgt, as_json)
    with common.registry(settings) as reg:
        entries = queueing.listing(settings, tgt, reg)
    if as_json:
        render.print_json({"target_label": tgt.label, "queue": entries})
        return
    if not entries:
        render.out(f"nothing is queued on {tgt.label}")
        return
    render.table(f"queued on {tgt.label}", ["position", "id", "sweep", "budget", "revision", "queued", "message"],
                 [[e["position"], e["id"] if e["mine"] else f"{e['id']} (another clone's)", e.get("sweep"),
                   _budget(e), (e.get("revision") or "")[:10], render.when(e.get("queued")), e.get("message")]
                  for e in entries])
    for e in entries:
        if e.get("waiting"):
            render.out(f"experiment {e['id']} has not started: {e['waiting']}")  # "experiment 31 is running", ...


def _slurm_pending(settings, tgt, as_json: bool) -> None:
    from ..launch import slurm

    with common.registry(settings) as reg:
        entries = slurm.pending(settings, tgt, reg)
    if as_json:
        render.print_json({"target_label": tgt.label, "queue": entries})
        return
    if not entries:
        render.out(f"no job of this project is pending on {tgt.label}")
        return
    render.table(f"pending on {tgt.label}", ["position", "id", "job", "partition", "reason", "priority", "since"],
                 [[e["position"], e["id"], e["job_id"], e.get("partition"), e.get("reason"), e.get("priority"),
                   render.when(e.get("since"))] for e in entries])


def _budget(entry: dict) -> str | None:
    if entry.get("max_steps"):
        return f"{entry['max_steps']} steps"
    if entry.get("max_minutes"):
        return f"{entry['max_minutes']} min"
    return None


@app.command()
def remove(ctx: typer.Context, exp_id: IdArg, target: TargetOpt = None, ct: CtOpt = None,
           as_json: JsonOpt = False, trust_new_host: TrustOpt = False) -> None:
    """Take one experiment out of the target's queue; it is recorded as stopped before it started."""
    from ..errors import NotFoundError
    from ..launch import queueing

    settings = common.settings(ctx)
    with common.registry(settings) as reg:
        exp = reg.get(exp_id)
        if exp.status != "queued":
            raise NotFoundError(f"experiment {exp_id} is not queued (it is {exp.status})",
                                hint="orch queue lists what is queued; orch stop stops a running one")
        tgt = common.target(settings, target, ct, trust=trust_new_host)
        removed = queueing.remove(settings, tgt, reg, ids=[exp_id])
        if not removed:
            exp = reg.get(exp_id)
            raise NotFoundError(f"experiment {exp_id} is not in the queue on {tgt.label} (it is {exp.status})",
                                hint="orch queue lists what is queued there")
    if as_json:
        render.print_json({"removed": removed, "target_label": tgt.label})
        return
    render.out(f"experiment {exp_id}: removed from the queue on {tgt.label}")
