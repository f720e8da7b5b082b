"""orch pull: a run's checkpoints, outputs and log copied to this machine, only what is missing or changed."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Optional

import typer

from . import common, render
from .common import CtsOpt, JsonOpt, TargetsOpt, TrustOpt

ExperimentOpt = Annotated[Optional[int], typer.Option("--experiment", "-e", min=1, max=common.ID_MAX,
                                                      help="Experiment id (default: the target's latest)")]
CheckpointsOpt = Annotated[bool, typer.Option("--checkpoints", help="The checkpoint folder; with a trash entry's "
                                              "name among the arguments (orch checkpoints list), that entry")]
OutputsOpt = Annotated[bool, typer.Option("--outputs", help="What the run wrote in its work folder")]
LogOpt = Annotated[bool, typer.Option("--log", help="The run's log (train.log)")]
WordsArg = Annotated[Optional[list[str]], typer.Argument(
    metavar="ENTRY|GLOB", help="Only paths matching these patterns ('*.pt'); with --checkpoints, a trash entry's name")]
ToOpt = Annotated[Optional[Path], typer.Option("--to", help="Folder to pull into (default: ./orch-pull/exp<id>)")]
NodeOpt = Annotated[Optional[int], typer.Option("--node", min=0, max=common.ID_MAX,
                                                help="A job's node to pull from (rank; default 0)")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace local files that differ from the run's")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="List what would come, and change nothing")]


def pull(ctx: typer.Context, words: WordsArg = None, experiment: ExperimentOpt = None,
         checkpoints: CheckpointsOpt = False, outputs: OutputsOpt = False, log: LogOpt = False, to: ToOpt = None,
         node: NodeOpt = None, force: ForceOpt = False, dry_run: DryRunOpt = False, target: TargetsOpt = None,
         ct: CtsOpt = None, as_json: JsonOpt = False, trust_new_host: TrustOpt = False) -> None:
    """Copy a run's checkpoints, outputs and log here (all three unless some are named), sending only what is
    missing or changed; a cut pull resumes where it stopped, and a local file that differs is never replaced
    without --force."""
    from .. import checkpoints as ckpts
    from ..errors import InputError, NotFoundError
    from ..launch import pull as pulling
    from ..watch import log_view
    from ..watch.metrics_view import target_flags
    from . import progress

    settings = common.settings(ctx)
    with common.registry(settings) as reg:
        exp = reg.get(experiment) if experiment is not None and not target and not ct else None
    grp = common.job_group(settings, exp, trust=trust_new_host) if exp is not None and exp.nodes \
        else common.group(settings, target, ct, trust=trust_new_host)
    if grp is not None:
        from ..launch import multinode

        with common.registry(settings) as reg:
            exp = reg.get(experiment) if experiment is not None else multinode.job(reg, grp)
            run_registry = reg.run_registry(exp.id)
        rank = node or 0
        if rank >= len(grp.members):
            raise InputError(f"--node {rank}: experiment {exp.id} has nodes 0 to {len(grp.members) - 1}",
                             hint="see orch status for the job's nodes")
        tgt, where = grp.members[rank], Path("orch-pull") / f"exp{exp.id}" / f"node{rank}"
    else:
        if node is not None:
            raise InputError("--node names a node of a job over several nodes, and this is one target",
                             hint="drop --node (or name the job: orch pull -e ID --node 1)")
        resolve = functools.partial(common.target, settings, trust=trust_new_host)
        with common.registry(settings) as reg:
            if exp is not None:  # where it ran: its files need no reconciling of the rows first
                tgt, run_registry = resolve(*target_flags(settings, exp)), reg.run_registry(exp.id)
            else:
                tgt, exp, run_registry = log_view.find_run(settings, reg, experiment, common.single(target, ct),
                                                           lambda name, ct_: resolve(name, ct_))
        where = Path("orch-pull") / f"exp{exp.id}"
        tgt = ckpts.ran_with(tgt, exp)  # the root and folder it ran with, not today's orch.toml
    sel = pulling.selection(exp.checkpoints or tgt.checkpoints, want_checkpoints=checkpoints, outputs=outputs,
                            log=log, words=list(words or []))
    try:
        res = pulling.pull(settings, tgt, exp.id, run_registry, sel, to or where, force=force, dry_run=dry_run,
                           meter=progress.meter(as_json), notice=lambda m: render.say(f"orch: {m}"))
    except NotFoundError:
        if exp.status != "queued":  # a queued experiment's files are not on the target: its run has no folder yet
            raise
        raise NotFoundError(f"experiment {exp.id} is queued on {tgt.label} and has not started: it has no files to "
                            "pull yet", hint="orch queue says why it waits; pull it once it runs") from None
    _show(res, exp.id, tgt.label, as_json)


def _show(res, exp_id: int, label: str, as_json: bool) -> None:
    from ..launch.pull_plan import summary

    if as_json:
        render.print_json(res.public())
        return
    for s in res.skipped:
        links = " (links are never followed)" if "symlink" in s["why"] else ""
        render.say(f"orch: skipped {s['key']}: {s['why']}{links}")
    counts = summary(res.items)
    moved: dict = {}
    for i in res.items:
        if i.entry:
            moved[i.entry] = moved.get(i.entry, 0) + 1
    for entry, n in moved.items():
        render.say(f"orch: {n} of experiment {exp_id}'s checkpoint file(s) come from trash entry {entry}, where a "
                   "clean moved them")
    if res.dry_run:
        rows = [[i.key, render.size(i.size), i.action + (f" from {render.size(i.offset)}" if i.offset else "")
                 + (f" (from trash entry {i.entry})" if i.entry else "")] for i in res.items]
        if rows:
            render.table(f"experiment {exp_id} on {label} -> {res.dest}", ["file", "size", "would"], rows)
        render.out(f"would pull {counts['files'] - counts.get('same', 0)} of {counts['files']} file(s), "
                   f"{render.size(counts['bytes'])} (dry run: nothing written)")
        return
    same = counts.get("same", 0)
    render.out(f"pulled {counts['files'] - same} file(s), {render.size(res.sent)} sent, from experiment {exp_id} "
               f"on {label} into {res.dest}" + (f" ({same} already here)" if same else ""))


def register(app: typer.Typer) -> None:
    app.command()(pull)
