"""deploy, restart, stop, play: the operations that change a target."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from . import progress
from . import common, render
from .common import CtsOpt, JsonOpt, SetOpt, StartOpt, TargetsOpt, TrustOpt
from .logs import ExperimentOpt

MessageOpt = Annotated[Optional[str], typer.Option("--message", "-m", help="What this experiment tries")]
CleanOpt = Annotated[bool, typer.Option("--clean-checkpoints", help="Move the checkpoints to the trash first "
                                        "(restorable with orch checkpoints restore)")]
PurgeOpt = Annotated[bool, typer.Option("--purge", help="Delete the checkpoints for good (asks first)")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation")]
DryOpt = Annotated[bool, typer.Option("--dry-run", help="Print the plan and change nothing")]
GuardOpt = Annotated[bool, typer.Option("--guard", help="Watch the new run against the one it replaces ([guard]) "
                                        "and put that one back if it is worse; its checkpoints are moved aside")]


WaitOpt = Annotated[Optional[float], typer.Option(
    "--wait", help="Watch the run until its first metric line, its end, or SECONDS pass (alone: 60 s; "
                   "default: [run] wait); a crash exits non-zero with the log's last lines", min=0)]


GpusOpt = Annotated[Optional[int], typer.Option(
    "--gpus", min=1, help="Give the run N free GPUs (CUDA_VISIBLE_DEVICES); with several --ct/--target or "
                          "--pool: on the machine that has them")]
PoolOpt = Annotated[Optional[str], typer.Option("--pool", help="Choose among [pools.NAME] members (with --gpus)")]


NodesOpt = Annotated[Optional[int], typer.Option("--nodes", min=1, help="On a kind = \"slurm\" target: the "
                                                "nodes the job asks Slurm for")]


def _placed(settings, gpus, pool, names, cts, start, trust):
    """``--gpus N``: the machine and GPUs chosen, said with why, and the flags naming that machine (where orch
    places runs: Slurm chooses the node of its job, whose --gres --gpus is)."""
    from ..launch import scheduler

    if not scheduler.named(settings, names, cts).places:
        return None, None
    if gpus is None:
        if pool is not None:
            from ..errors import InputError

            raise InputError("--pool chooses a machine by its free GPUs", hint="give --gpus N with --pool")
        return None, None
    from ..launch import placement

    wanted = placement.candidates(settings, names, cts, pool)
    choice = placement.place(settings, wanted, gpus,
                             lambda n, c: common.target(settings, n, c, start=start, trust=trust))
    render.say(f"placement: {choice.reason}")
    for line in choice.others:
        render.say(f"  not {line}")
    return choice, wanted[choice.key]
BesideOpt = Annotated[bool, typer.Option("--beside", help="Start it next to the project's running experiments on "
                                         "--gpus N GPUs none of them holds (else refused; with --queue: queued)")]
QueueOpt = Annotated[bool, typer.Option("--queue", help="Queue it on the target: it starts when the running "
                                        "experiment ends, with no orch connected (orch queue lists it)")]


def _target(settings, name, ct, start, trust, dry_run):
    """The target to act on; a dry run that cannot resolve it still shows the plan."""
    return common.for_plan(lambda **kw: common.target(settings, name, ct, **kw), dry_run=dry_run, start=start,
                           trust=trust, where="the target")


def _run(launch, settings, dry_run: bool, as_json: bool, flags: tuple = (None, None)) -> None:
    from ..errors import Interrupted
    from ..launch.operations import execute

    if dry_run:
        return _dry_run(launch, as_json)
    try:
        with common.registry(settings) as reg:
            outcome = execute(launch, reg)
    except KeyboardInterrupt:  # before the target was contacted
        raise Interrupted("interrupted: nothing was changed on the target") from None
    if outcome.experiment is not None and outcome.experiment.status != "failed":
        common.remember(settings, *flags, launch.target)
    _report(outcome, launch.target, as_json)


def _dry_run(launch, as_json: bool) -> None:
    from ..errors import OrchError
    from ..launch.operations import preview

    lines = render.plan_lines(launch.actions, launch.stop_ids)
    if launch.guard:
        g = launch.settings.guard
        lines.append(f"guard: watch the new run for {g.steps} steps against the run it stops (throughput at least "
                     f"{g.min_throughput:g}×" + (f", loss at most {g.max_loss_ratio:g}×" if g.max_loss_ratio else "")
                     + f"); on a failure: {g.on_fail}")
    seen, failure = None, launch.target.unasked
    if launch.target.connect is not None:
        try:
            seen = preview(launch)
        except OrchError as exc:
            failure = exc
    unreachable = failure.message if failure is not None else None
    if as_json:
        render.print_json({"playbook": launch.book.name, "target": launch.target.name,
                           "target_label": launch.target.label, "steps": lines,
                           "revision": launch.inputs.revision, "command": launch.inputs.command,
                           "argv": launch.inputs.argv, "batching": launch.inputs.batching, "target_state": seen,
                           "unreachable": unreachable,
                           "left_out": [d.public() for d in launch.revision.left_out] if launch.revision else []})
        if failure is not None:
            raise common.unasked(failure, launch.target.label)
        return
    render.out(f"plan for {launch.book.name} on {launch.target.label} (dry run: nothing is changed)")
    for line in lines:
        render.out("  " + line)
    if seen is None:
        render.out("what is on the target is unknown" + (": it could not be asked" if failure else ""))
        if failure is not None:
            raise common.unasked(failure, launch.target.label)
        return
    render.out("on the target now:")
    stop = ", ".join(f"experiment {i}" for i in seen["stop"]) or "nothing (no run of this project is up)"
    render.out(f"  would stop: {stop}")
    inv = seen["checkpoints"]
    if inv is not None:
        by = f", written by {seen['writer']}" if seen["writer"] is not None else ""
        what = (f"{inv['files']} file(s), {render.size(inv['bytes'])}, newest {inv['newest']}{by}"
                if inv["files"] else "empty")
        verb = {"keep": "kept (the run sees them)", "move": "moved to the trash",
                "purge": "DELETED"}[launch.inputs.checkpoint_action]
        render.out(f"  checkpoints {inv['path']}: {what}" + (f": {verb}" if inv["files"] else ""))
    if seen["send"] is not None:
        render.out(f"  would send: {seen['send']['files']} of {launch.inputs.files} file(s), "
                   f"{render.size(seen['send']['bytes'])}")
    if seen.get("env") is not None:
        env = seen["env"]
        render.out(f"  environment {env['hash']}: " + ("there, nothing to build" if env["there"] else "would be built"))
    if seen.get("doctor") is not None:
        bad = [f for f in seen["doctor"] if f["status"] != "ok"]
        render.out(f"  doctor: {len(seen['doctor']) - len(bad)} checks ok" + ("" if bad else ", none failed"))
        for f in bad:
            render.out(f"    {f['status']}: {f['check']}: {f['reason']}" + (f" (fix: {f['fix']})" if f["fix"] else ""))
        if any(f["status"] == "fail" for f in bad):
            render.out("  the launch would be refused (exit 6)")


def _report(outcome, target, as_json: bool) -> None:
    exp = outcome.experiment
    waited = outcome.waited or {}
    if as_json:
        render.print_json({"experiment": exp.public() if exp else None, "target_label": target.label,
                           "stopped": outcome.stopped, "checkpoints": outcome.checkpoints,
                           "pushed": outcome.pushed, "shell": outcome.shell, "waited": outcome.waited,
                           "guard": outcome.verdict, "stats": outcome.stats, "queue": outcome.queue})
    else:
        _say_outcome(outcome, target)
    verdict = outcome.verdict or {}
    if exp is not None and verdict.get("state") in ("rolled back", "rollback failed", "stopped on failure"):
        render.say(f"error: the guard of experiment {exp.id} failed on {target.label}: "
                   f"{exp.end_reason or verdict.get('reason')}")
        if verdict.get("restored") is not None:
            render.say(f"hint: experiment {verdict['restored']} runs the parent again: orch status, "
                       f"orch logs -e {verdict['restored']}")
        else:
            render.say(f"hint: orch logs -e {exp.id} shows its log; the parent's checkpoints are in the trash "
                       "(orch checkpoints list, orch checkpoints restore)")
        raise typer.Exit(1)
    if exp is not None and exp.status == "crashed":
        for line in waited.get("tail") or []:
            render.say(f"  | {line}")
        render.say(f"error: experiment {exp.id} crashed on {target.label} ({render.exit_code(exp.exit_code)}) "
                   f"{waited.get('seconds', 0):g} s after it started")
        render.say(f"hint: orch logs -e {exp.id} shows its whole log")
        raise typer.Exit(1)


def _say_outcome(outcome, target) -> None:
    exp = outcome.experiment
    for run in outcome.stopped:
        render.say(f"stopped {render.which(run)}: {run['state']} ({render.exit_code(run['exit_code'], 'exit')})")
    if outcome.pushed:
        p = outcome.pushed
        resumed = f", resuming after {render.size(p['resumed_bytes'])} sent before" if p.get("resumed_bytes") else ""
        render.say(f"revision: {p['missing']} of {p['files']} file(s) sent ({render.size(p['bytes'])}{resumed})")
    ck = outcome.checkpoints
    # -e names the folder the entry belongs to whatever orch.toml says later (a --set paths.checkpoints launch)
    restore = f"orch checkpoints restore -e {exp.id}" if exp is not None else "orch checkpoints restore"
    if ck and ck.get("action") == "moved":
        render.say(f"checkpoints: {ck['moved']} file(s) moved to {ck['entry_path']} ({restore} {ck['entry']})")
    elif ck and ck.get("action") == "purged":
        render.say(f"checkpoints: {ck.get('deleted', ck['moved'])} file(s) deleted")
        if ck.get("kept"):
            render.say(f"checkpoints: {len(ck['kept'])} file(s) written after the confirmation were moved to "
                       f"{ck['entry_path']}, not deleted ({restore} {ck['entry']})")
    for p in (ck or {}).get("purged", []) or []:
        render.say(f"trash retention: deleted {p['entry']} ({render.size(p['bytes'])})")
    for sh in outcome.shell:
        if sh.get("skipped"):
            render.say(f"warning: shell step skipped: {sh['skipped']} on {target.label}")
        elif sh.get("stdout"):
            render.out(sh["stdout"].rstrip())
    if exp is None:
        return
    waited = outcome.waited or {}
    from ..launch import scheduler

    said = scheduler.of(target).started(exp, outcome, target.label)
    if said is not None:
        render.out(said)
        return
    if exp.status == "running" and waited.get("metric"):
        render.out(f"experiment {exp.id}: running on {target.label} (revision {exp.revision}); "
                   f"first metrics after {waited['seconds']:g} s: {waited['line']}")
    elif exp.status == "running" and waited:
        render.out(f"experiment {exp.id}: running on {target.label} (revision {exp.revision}); no metric line "
                   f"within {waited['seconds']:g} s (orch logs --follow)")
    elif exp.status == "running":
        render.out(f"experiment {exp.id}: started on {target.label} (revision {exp.revision}); "
                   "orch logs --follow shows it (a deploy with --wait waits for its first metric line)")
    elif exp.status == "queued":
        q = outcome.queue or {}
        behind = f" behind experiment {q['behind']}" if q.get("behind") else ""
        render.out(f"experiment {exp.id}: queued on {target.label} at position {q.get('position')}{behind} "
                   f"(revision {exp.revision}); orch queue lists the queue")
    else:
        render.out(f"experiment {exp.id}: {exp.status} on {target.label} (revision {exp.revision})")
    if (outcome.verdict or {}).get("state") == "passed":
        render.out(f"guard: passed after {outcome.verdict['seconds']:g} s")
    elif outcome.verdict and outcome.verdict.get("state") == "watching":
        render.out(f"guard: still watching after {outcome.verdict['seconds']:g} s (orch status)")


def deploy(ctx: typer.Context, target: TargetsOpt = None, ct: CtsOpt = None, message: MessageOpt = None,
           set_: SetOpt = None, clean_checkpoints: CleanOpt = False, purge: PurgeOpt = False,
           yes: YesOpt = False, dry_run: DryOpt = False, start: StartOpt = False,
           trust_new_host: TrustOpt = False, wait: WaitOpt = None, queue: QueueOpt = False,
           guard: GuardOpt = False, as_json: JsonOpt = False, gpus: GpusOpt = None, pool: PoolOpt = None,
           beside: BesideOpt = False, nodes: NodesOpt = None) -> None:
    """Push the code as a new revision and start it as a new experiment; it replaces every running experiment of
    the project on the target, unless --beside starts it next to them."""
    from .. import secrets

    from . import job

    settings = common.settings(ctx, set_)
    secret = secrets.collect(settings.project.secrets, settings.state_dir)  # a missing one: stopped before the target
    if beside:
        return _beside(settings, target, ct, message, secret, gpus, queue, dry_run, start, trust_new_host, wait,
                       as_json, guard=guard, clean=clean_checkpoints or purge, pool=pool)
    choice, one = _placed(settings, gpus, pool, target, ct, start, trust_new_host)
    grp = None if choice is not None else job.group(settings, target, ct, start, trust_new_host, dry_run)
    one = one or common.single(target, ct)
    tgt = choice.target if choice is not None else \
        grp.members[0] if grp is not None else _target(settings, *one, start, trust_new_host, dry_run)
    from ..launch import prepare  # once the target is known: its connection readies meanwhile

    confirm = render.confirm if render.interactive() else None
    launch = prepare.deploy(settings, tgt, message=message, clean=clean_checkpoints or purge or guard, purge=purge,
                            yes=yes, confirm=confirm, echo=render.say, secret=secret,
                            progress=progress.meter(as_json),
                            stream=not (dry_run or queue or guard or choice is not None or grp is not None))
    launch.wait = settings.run.wait if wait is None else wait
    if choice is not None:
        from ..launch.placement import apply

        apply(launch, choice)
    from ..launch import scheduler

    sched = scheduler.of(tgt)
    launch.resources = sched.resources(gpus, nodes)
    launch.guard = guard
    ours = queue and not sched.queues  # orch's queue on the target; Slurm's: submitted beside the running job
    if grp is not None and (ours or guard):
        from ..errors import InputError

        raise InputError("a job over several nodes cannot be queued" if ours else
                         "--guard watches one run against one parent, not a job",
                         hint="deploy the job without --queue" if ours else "deploy the job without --guard")
    if ours and guard:
        from ..errors import InputError

        raise InputError("a queued run has no running parent to be guarded against",
                         hint="give --queue or --guard, not both")
    if queue:
        launch = sched.queued(launch)
    if grp is not None:
        return job.deploy(launch, grp, settings, dry_run, as_json)
    _run(launch, settings, dry_run, as_json, one)


def _beside(settings, target, ct, message, secret, gpus, queue, dry_run, start, trust, wait, as_json, *, guard,
            clean, pool) -> None:
    """``deploy --gpus N --beside``: placed next to the running experiments, queued, or refused (launch/beside)."""
    from ..launch import beside, prepare

    from . import job

    beside.refuse_flags(gpus, guard=guard, clean=clean, pool=pool, machines=len(target or []) + len(ct or []))
    if job.group(settings, target, ct, start, trust, dry_run) is not None:
        beside.refuse_flags(gpus, job=True)
    one = common.single(target, ct)
    tgt = _target(settings, *one, start, trust, dry_run)
    launch = prepare.deploy(settings, tgt, message=message, clean=False, purge=False, yes=True, confirm=None,
                            echo=render.say, secret=secret, progress=progress.meter(as_json))
    launch.wait = settings.run.wait if wait is None else wait
    if tgt.connect is not None:
        launch = beside.beside(launch, gpus, queue)
    _run(launch, settings, dry_run, as_json, one)


def restart(ctx: typer.Context, target: TargetsOpt = None, ct: CtsOpt = None, message: MessageOpt = None,
            clean_checkpoints: CleanOpt = False, purge: PurgeOpt = False, yes: YesOpt = False,
            dry_run: DryOpt = False, start: StartOpt = False, trust_new_host: TrustOpt = False,
            wait: WaitOpt = None, guard: GuardOpt = False, as_json: JsonOpt = False, gpus: GpusOpt = None,
            pool: PoolOpt = None, beside: BesideOpt = False, experiment: ExperimentOpt = None) -> None:
    """Stop the latest experiment and relaunch its revision and settings as a new experiment (-e ID: that
    experiment's; --beside: next to it, on free GPUs, stopping nothing); a job: on every node."""
    from ..launch import prepare

    from . import job

    settings = common.settings(ctx)
    parent, named = None, bool(target or ct)
    if experiment is not None:  # where it ran, unless a target is given
        one_target, one_ct = _flags_of(settings, target, ct, experiment)
        target, ct = ([one_target] if one_target else None), ([one_ct] if one_ct is not None else None)
        with common.registry(settings) as reg:
            parent = reg.get(experiment)
    confirm = render.confirm if render.interactive() else None
    if beside:
        from ..launch import beside as besides

        besides.refuse_flags(gpus, guard=guard, clean=clean_checkpoints or purge, pool=pool,
                             machines=len(target or []) + len(ct or []))
    choice, one = (None, None) if beside else _placed(settings, gpus, pool, target, ct, start, trust_new_host)
    if parent is not None and parent.nodes and not beside and not named:  # -e of a job: on its nodes
        grp = common.job_group(settings, parent, trust=trust_new_host)
    else:
        grp = None if choice is not None else job.group(settings, target, ct, start, trust_new_host, dry_run)
    if grp is not None and (guard or beside):
        from ..errors import InputError

        raise InputError("--guard watches one run against one parent, not a job" if guard else
                         "--beside starts one run next to the running ones on one machine, not a job",
                         hint="restart the job without --guard" if guard else "restart the job without --beside")
    if grp is not None:
        return job.restart(settings, grp, message=message, clean=clean_checkpoints or purge, purge=purge,
                           yes=yes, confirm=confirm, dry_run=dry_run, as_json=as_json,
                           parent=parent if parent is not None and parent.nodes else None)
    target, ct = one or common.single(target, ct)
    tgt = choice.target if choice is not None else _target(settings, target, ct, start, trust_new_host, dry_run)
    if parent is not None:  # where it ran: its root and checkpoint folder
        from .. import checkpoints

        tgt = checkpoints.ran_with(tgt, parent)
    with common.registry(settings) as reg:
        if tgt.connect is not None:  # a launch an earlier orch left behind may be the one to restart
            from ..records.reconcile import recover

            recover(settings, tgt, reg)
        launch = prepare.restart(settings, tgt, reg, message=message, clean=clean_checkpoints or purge or guard,
                                 purge=purge, yes=yes, confirm=confirm, echo=render.say, parent=parent, job=False)
    launch.wait = settings.run.wait if wait is None else wait
    if choice is not None:
        from ..launch.placement import apply

        apply(launch, choice)
    from ..launch import scheduler

    launch.resources = scheduler.of(tgt).resources(gpus, None)
    if beside and tgt.connect is not None:
        launch = besides.beside(launch, gpus, queue=False)
    launch.guard = guard
    _run(launch, settings, dry_run, as_json, (target, ct))


StopAllOpt = Annotated[bool, typer.Option("--all", help="Stop every live run of the project there (those side by "
                                          "side too) and empty the target's queue of this project (else the next "
                                          "queued experiment starts when this one has stopped)")]


def stop(ctx: typer.Context, target: TargetsOpt = None, ct: CtsOpt = None, dry_run: DryOpt = False,
         trust_new_host: TrustOpt = False, all_: StopAllOpt = False, as_json: JsonOpt = False,
         experiment: ExperimentOpt = None) -> None:
    """Stop the running experiment gracefully (SIGINT, then SIGTERM, then SIGKILL); several side by side: the
    latest (-e ID: that one; --all: every one); a job: every node at once."""
    from ..errors import CtNotRunning
    from ..launch import prepare
    from . import job

    settings = common.settings(ctx, lenient=True)
    grp = None if dry_run or experiment is not None else job.group(settings, target, ct, False, trust_new_host, False)
    if grp is not None:
        return job.stop(settings, grp, as_json)
    flags = _flags_of(settings, target, ct, experiment)
    try:
        tgt = _target(settings, *flags, False, trust_new_host, dry_run)
        launch = prepare.stop(settings, tgt, echo=render.say)
        launch.stop_ids = [experiment] if experiment is not None else \
            None if tgt.connect is None or all_ else _latest_of_several(settings, tgt)
        if dry_run:
            return _run(launch, settings, True, as_json)
        from ..launch.operations import execute

        dequeued: list = []
        with common.registry(settings) as reg:
            if all_:  # first, so that the stop starts nothing
                from ..launch import queueing

                dequeued = queueing.remove(settings, tgt, reg)
            outcome = execute(launch, reg)
    except CtNotRunning as exc:  # its runs ended with it: the row says so, rather than running for good
        if experiment is None or dry_run or not _settle_stopped(settings, flags, experiment, exc, as_json):
            raise
        return
    if as_json:
        render.print_json({"stopped": outcome.stopped, "dequeued": dequeued, "target_label": tgt.label,
                           "settled": [{"id": i, "why": why} for i, why in outcome.settled]})
        return
    if dequeued:
        render.out(f"removed from the queue on {tgt.label}: " + ", ".join(f"experiment {i}" for i in dequeued))
    for exp_id, why in outcome.settled:
        render.out(f"experiment {exp_id}: {why}; recorded as lost")
    if not outcome.stopped and not outcome.settled:
        render.out(f"experiment {experiment} was not running on {tgt.label}" if experiment is not None else
                   f"nothing was running on {tgt.label}")
    for run in outcome.stopped if not as_json else []:
        render.out(f"{render.which(run)} on {tgt.label}: {run['state']} ({render.exit_code(run['exit_code'], 'exit')}, "
                   f"signals: {', '.join(run['signals']) or 'none'})")


def _settle_stopped(settings, flags: tuple, experiment: int, exc, as_json: bool) -> bool:
    """``stop -e N`` on a CT that is stopped: row N recorded lost, with what the API said; False where it was not
    running there (the error stands)."""
    from ..records import unknown_runs

    tgt = common.target(settings, *flags, resolve=False)
    with common.registry(settings) as reg:
        why = unknown_runs.settle_stopped_ct(reg, tgt, settings.project.name, experiment, exc.message)
    if why is None:
        return False
    if "; " in exc.message:  # what answered at the CT's address, too
        render.say(f"orch: {exc.message}")
    if as_json:
        render.print_json({"stopped": [], "settled": [{"id": experiment, "why": why}], "target_label": tgt.label})
    else:
        render.out(f"experiment {experiment}: {why}; recorded as lost")
    return True


def _flags_of(settings, target, ct, experiment) -> tuple:
    """The target flags, or where experiment ``experiment`` ran when none are given."""
    if experiment is None or target or ct:
        return common.single(target, ct)
    from ..watch.metrics_view import target_flags

    with common.registry(settings) as reg:
        return target_flags(settings, reg.get(experiment))


def _latest_of_several(settings, tgt) -> list[int] | None:
    """A bare stop with several runs of the project side by side: the latest alone, said on stderr; else None
    (every run of the project there, as before)."""
    from ..records import side_by_side
    from ..records.reconcile import recover

    project = settings.project.name
    with common.registry(settings) as reg:
        if len(side_by_side.live(reg, tgt, project)) < 2:
            return None
        recover(settings, tgt, reg)  # the rows may say running of a run that ended since
        live = side_by_side.live(reg, tgt, project)
    if len(live) < 2:
        return None
    render.say(f"orch: {side_by_side.note(project, [e.id for e in live], live[0].id)}")
    return [live[0].id]


def play(ctx: typer.Context, file: Annotated[Path, typer.Argument(help="A playbook .yaml")],
         target: TargetsOpt = None, ct: CtsOpt = None, message: MessageOpt = None, set_: SetOpt = None,
         clean_checkpoints: CleanOpt = False, yes: YesOpt = False, dry_run: DryOpt = False,
         start: StartOpt = False, trust_new_host: TrustOpt = False, as_json: JsonOpt = False) -> None:
    """Run any playbook (a YAML list of steps) against a target."""
    from ..launch import prepare

    target, ct = common.one_node(target, ct, "play")
    settings = common.settings(ctx, set_)
    secret = prepare.secret_values(settings) if prepare.launches(file) else None
    tgt = _target(settings, target, ct, start, trust_new_host, dry_run)
    confirm = render.confirm if render.interactive() else None
    launch = prepare.play(settings, tgt, file, message=message, clean=clean_checkpoints, purge=False, yes=yes,
                          confirm=confirm, echo=render.say, secret=secret, progress=progress.meter(as_json))
    _run(launch, settings, dry_run, as_json, (target, ct))


def register(app: typer.Typer) -> None:
    app.command()(deploy)
    app.command()(restart)
    app.command()(stop)
    app.command()(play)
