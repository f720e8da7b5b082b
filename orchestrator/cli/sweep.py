"""orch sweep --set k=a,b [--steps N | --minutes M] | --trials N | show S | stop S | resume S: variants launched,
searched, compared, stopped as one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from . import common, render, sweep_search
from .common import CtsOpt, JsonOpt, TargetsOpt, TrustOpt

app = typer.Typer(help="Sweeps: the cartesian product of --set values, queued on the targets as one group, or a "
                  "search of ranges (--trials N) that prunes from the log as printed.")

SweepSetOpt = Annotated[Optional[list[str]], typer.Option(
    "--set", help="section.key=value1,value2,... (a list), or a range: loguniform(1e-5,1e-2), uniform(0,0.3), "
    "int(1,8), logint(16,1024) (repeat for more axes)")]
StepsOpt = Annotated[Optional[int], typer.Option("--steps", min=1, help="Each variant ends gracefully after this "
                                                 "many steps (ORCH_MAX_STEPS; counted from its metric lines)")]
MinutesOpt = Annotated[Optional[float], typer.Option("--minutes", min=0.01, help="Each variant ends gracefully "
                                                     "after this many minutes (ORCH_MAX_MINUTES)")]
SweepArg = Annotated[str, typer.Argument(metavar="SWEEP", help="The sweep's id (orch experiments list shows it)")]


@app.callback(invoke_without_command=True)
def sweep(ctx: typer.Context, set_: SweepSetOpt = None, steps: StepsOpt = None, minutes: MinutesOpt = None,
          target: TargetsOpt = None, ct: CtsOpt = None,
          message: Annotated[Optional[str], typer.Option("--message", "-m", help="What this sweep tries")] = None,
          trust_new_host: TrustOpt = False, as_json: JsonOpt = False,
          gpus: Annotated[Optional[int], typer.Option("--gpus", min=1, help="K GPUs per variant: the variants run side by side on the free GPUs, as many at once as fit")] = None,
          beside: Annotated[bool, typer.Option("--beside", help="Run the variants side by side, each on --gpus K "
                                               "free GPUs (implied by --gpus K)")] = False,
          trials: Annotated[Optional[int], typer.Option("--trials", min=1, help="Search: how many trials to run "
                                                        "(needed with a range)")] = None,
          sampler: Annotated[Optional[str], typer.Option("--sampler", help="tpe (the default with a range), "
                                                         "random, or grid")] = None,
          prune: Annotated[Optional[str], typer.Option("--prune", help="median (the default of a search), asha, "
                                                       "or none")] = None,
          metric: Annotated[Optional[str], typer.Option("--metric", help="The objective, a metric the log prints "
                                                        "(default: the eval loss when printed, else loss)")] = None,
          mode: Annotated[Optional[str], typer.Option("--mode", help="min (default) or max")] = None,
          rung_by: Annotated[Optional[str], typer.Option("--rung-by", help="steps (default) or tokens: trials "
                                                         "meet at the same data seen")] = None,
          min_steps: Annotated[Optional[int], typer.Option("--min-steps", min=1, help="Grace before pruning, "
                                                           "and the distance between rungs (default: a twelfth "
                                                           "of --steps)")] = None,
          parallel: Annotated[Optional[int], typer.Option("--parallel", min=1, help="Trials in flight at once "
                                                          "(default 1; with --gpus G, side by side)")] = None,
          seed: Annotated[Optional[int], typer.Option("--seed", help="The sampler's seed")] = None,
          foreground: Annotated[bool, typer.Option("--foreground", help="Conduct the search in this process "
                                                   "rather than a detached one")] = False,
          on_target: Annotated[bool, typer.Option("--on-target", help="Conduct the search on its one target, kept "
                                                  "alive there as its queue is (searches project.env values)")]
          = False,
          ) -> None:
    """Launch every combination of the --set values as one sweep, spread over the targets (each --target or
    --ct in turn) and queued behind each other on each (--gpus K: side by side on free GPUs, the rest waiting).
    With a range and --trials N, search it instead: a conductor asks Optuna for each trial and prunes the losers
    from their logs (orch sweep show ranks them)."""
    if ctx.invoked_subcommand is not None:
        return
    from ..launch import space
    from ..launch import sweep as sweeping

    flags = {"--prune": prune, "--metric": metric, "--mode": mode, "--rung-by": rung_by, "--min-steps": min_steps,
             "--parallel": parallel, "--seed": seed, "--on-target": on_target or None}
    chosen = space.plan(set_ or [], trials, sampler, searching=any(v is not None for v in flags.values()))
    if chosen.search:
        return sweep_search.start(ctx, chosen, set_ or [], steps=steps, minutes=minutes, target=target, ct=ct,
                                  message=message, trust=trust_new_host, as_json=as_json, gpus=gpus, beside=beside,
                                  prune=prune, metric=metric, mode=mode, rung_by=rung_by, min_steps=min_steps,
                                  parallel=parallel, seed=seed, foreground=foreground, on_target=on_target)
    settings = common.settings(ctx)
    sweeping.variants(set_ or [])  # bad --set values are refused before any target is asked
    sweeping.budget_env(steps, minutes)
    per_variant = sweeping.check_beside(gpus, beside)
    names = [(n, None) for n in target or []] + [(None, c) for c in ct or []] or [(None, None)]
    targets = [common.target(settings, n, c, trust=trust_new_host) for n, c in names]
    with common.registry(settings) as reg:
        done = sweeping.launch(set_ or [], steps, minutes, targets, lambda o: common.settings(ctx, o), reg,
                               echo=render.say, message=message, beside_gpus=per_variant)
    if as_json:
        render.print_json({"sweep": done.sweep, "variants": done.rows})
        return
    render.out(f"sweep {done.sweep}: {len(done.rows)} variant(s)")
    for row in done.rows:
        where = "running" if row["status"] == "running" else f"{row['status']} at position {row['position']}"
        said = ", ".join(f"{k}={v}" for k, v in row["settings"].items())
        render.out(f"  experiment {row['id']}: {said}: {where} on {row['target']}")
    render.out(f"orch sweep show {done.sweep} compares them; orch sweep stop {done.sweep} stops them all")


def _targets_of(settings, exps: list, trust: bool) -> dict:
    """One target per machine the sweep's experiments ran on (or are queued on)."""
    from ..watch.metrics_view import target_flags

    found: dict = {}
    for exp in exps:
        if exp.machine not in found:
            name, ct = target_flags(settings, exp)
            found[exp.machine] = common.target(settings, name, ct, trust=trust)
    return found


@app.command()
def show(ctx: typer.Context, sweep_id: SweepArg, as_json: JsonOpt = False, trust_new_host: TrustOpt = False) -> None:
    """One row per variant: the settings that differ, throughput over the same step window, loss at the last
    step all reached, the batching plan's padding efficiency and state; the best marked."""
    from ..errors import NotFoundError, OrchError
    from ..records.reconcile import recover
    from ..watch import metrics_view, sweep_view

    settings = common.settings(ctx)
    if sweep_search.is_search(settings, sweep_id):
        return sweep_search.show(settings, sweep_id, as_json)
    with common.registry(settings) as reg:
        exps = reg.list(sweep=sweep_id)
        if not exps:
            raise NotFoundError(f"no sweep {sweep_id!r} in this project's registry",
                                hint="orch experiments list shows each experiment's sweep")
        targets = _targets_of(settings, exps, trust_new_host)
        for tgt in targets.values():
            try:
                recover(settings, tgt, reg)
            except OrchError as exc:
                render.say(f"orch: {tgt.label} not asked: {exc.message}")
        exps = reg.list(sweep=sweep_id)
        metrics_view.refresh_stale(settings, reg, exps, lambda e: targets[e.machine],
                                   notice=lambda m: render.say(f"orch: {m}"))
        table = sweep_view.rows(reg, sweep_id)
    if as_json:
        render.print_json(table)
        return
    window = table["window"]
    span = f"steps {window[0]:g}-{window[1]:g}" if window else "no steps yet"
    unit = next((v["throughput_unit"] for v in table["variants"]), "tok/s")
    render.table(f"sweep {sweep_id} (throughput over {span})",
                 ["", "id", *table["keys"], f"{unit}", f"loss@{window[1]:g}" if window else "loss", "eval loss",
                  "efficiency", "state"],
                 [["best" if v["best"] else "", v["id"], *v["settings"].values(),
                   f"{v['throughput']:.0f}" if v["throughput"] is not None else None,
                   f"{v['loss']:.4f}" if v["loss"] is not None else None,
                   f"{v['eval_loss']:.4f}" if v.get("eval_loss") is not None else None,
                   f"{v['efficiency']:.3f}" if v["efficiency"] is not None else None, v["status"]]
                  for v in table["variants"]])


@app.command()
def stop(ctx: typer.Context, sweep_id: SweepArg, as_json: JsonOpt = False, trust_new_host: TrustOpt = False) -> None:
    """Stop the sweep: its queued variants are taken out of the queues first, then its running ones stopped."""
    from ..errors import NotFoundError
    from ..launch import prepare, queueing
    from ..launch.operations import execute
    from ..records.reconcile import recover

    settings = common.settings(ctx)
    dequeued: list = []
    stopped: list = []
    conductor = sweep_search.halt(settings, sweep_id)  # first: it would ask a trial for each one stopped
    with common.registry(settings) as reg:
        exps = reg.list(sweep=sweep_id)
        if not exps and conductor is None:
            raise NotFoundError(f"no sweep {sweep_id!r} in this project's registry",
                                hint="orch experiments list shows each experiment's sweep")
        for machine, tgt in _targets_of(settings, exps, trust_new_host).items():
            dequeued += queueing.remove(settings, tgt, reg, sweep=sweep_id)
            recover(settings, tgt, reg)
            mine = {e.id for e in reg.list(sweep=sweep_id) if e.machine == machine and e.status == "running"}
            if mine:  # the sweep's own runs: its variants side by side, never another run beside them
                halt = prepare.stop(settings, tgt, echo=render.say)
                halt.stop_ids = sorted(mine)
                outcome = execute(halt, reg)
                stopped += [dict(r, target=tgt.label) for r in outcome.stopped]
    if sweep_search.is_search(settings, sweep_id):
        sweep_search.stopped(settings, sweep_id)
    if as_json:
        render.print_json({"sweep": sweep_id, "dequeued": dequeued, "stopped": stopped, "conductor": conductor})
        return
    if conductor is not None:
        render.out(f"sweep {sweep_id}: its conductor (process {conductor}) ended: no new trial starts")
    if dequeued:
        render.out(f"sweep {sweep_id}: removed from the queue: " + ", ".join(f"experiment {i}" for i in dequeued))
    for run in stopped:
        render.out(f"sweep {sweep_id}: {render.which(run)} on {run['target']}: {run['state']} "
                   f"({render.exit_code(run['exit_code'], 'exit')})")
    if not dequeued and not stopped:
        render.out(f"sweep {sweep_id}: nothing was queued or running")


@app.command()
def resume(ctx: typer.Context, sweep_id: SweepArg, as_json: JsonOpt = False,
           trial: Annotated[Optional[int], typer.Option("--trial", min=0, help="Resume this pruned (or stopped) "
                                                        "trial to its full budget from its checkpoint, as a restart "
                                                        "of its experiment")] = None) -> None:
    """Start a search's conductor again (after a reboot, or once it was killed): it picks up every trial where
    the study left it, runs none twice and loses none. --trial N: run a pruned trial on to its full budget."""
    if trial is not None:
        return sweep_search.resume_trial(ctx, sweep_id, trial, as_json)
    sweep_search.resume(ctx, sweep_id, as_json)


@app.command()
def plot(ctx: typer.Context, sweep_id: SweepArg,
         out: Annotated[Path, typer.Option("--out", "-o", help="Image to write (.png, .svg, .pdf)")]) -> None:
    """Draw a search's trials: parallel coordinates (one line per trial, the objective last, pruned trials grey)
    and the objective against each searched parameter (needs the plot extra)."""
    path = sweep_search.plot(common.settings(ctx), sweep_id, out)
    render.out(f"wrote {path}")


@app.command(hidden=True)
def conduct(ctx: typer.Context, sweep_id: SweepArg) -> None:
    """Conduct a search in this process until its last trial ends (orch sweep starts this, detached)."""
    sweep_search.conduct(ctx, sweep_id)


def register(typer_app: typer.Typer) -> None:
    typer_app.add_typer(app, name="sweep")
