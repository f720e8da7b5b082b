"""deploy, restart, stop, play: the operations that change a target."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from . import common, render
from .common import CtOpt, JsonOpt, SetOpt, StartOpt, TargetOpt, TrustOpt

MessageOpt = Annotated[Optional[str], typer.Option("--message", "-m", help="What this experiment tries")]
CleanOpt = Annotated[bool, typer.Option("--clean-checkpoints", help="Move the checkpoints to the trash first "
                                        "(restorable with orch checkpoints restore)")]
PurgeOpt = Annotated[bool, typer.Option("--purge", help="Delete the checkpoints for good (asks first)")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation")]
DryOpt = Annotated[bool, typer.Option("--dry-run", help="Print the plan and change nothing")]


def _dry_target(settings, name, ct):
    from ..targets import Target

    tname, spec = common.target(settings, name, ct, resolve=False)
    return Target(tname, spec, spec.root or settings.paths.root, spec.checkpoints or settings.paths.checkpoints,
                  spec.python, {"kind": spec.kind})


def _target(settings, name, ct, start, trust, dry_run):
    return _dry_target(settings, name, ct) if dry_run else common.target(settings, name, ct, start=start,
                                                                         trust=trust)


def _run(launch, settings, dry_run: bool, as_json: bool) -> None:
    from ..operations import execute
    from ..playbooks import plan

    lines = plan(launch.book, launch.inputs)
    if dry_run:
        if as_json:
            render.print_json({"playbook": launch.book.name, "target": launch.target.name, "steps": lines,
                               "revision": launch.inputs.revision, "command": launch.inputs.argv,
                               "batching": launch.inputs.batching})
            return
        render.out(f"plan for {launch.book.name} on {launch.target.name} (dry run: nothing is changed)")
        for line in lines:
            render.out("  " + line)
        return
    with common.registry(settings) as reg:
        outcome = execute(launch, reg)
    _report(outcome, as_json)


def _report(outcome, as_json: bool) -> None:
    exp = outcome.experiment
    if as_json:
        render.print_json({"experiment": exp.public() if exp else None, "stopped": outcome.stopped,
                           "checkpoints": outcome.checkpoints, "pushed": outcome.pushed, "stats": outcome.stats})
        return
    for run in outcome.stopped:
        render.say(f"stopped experiment {run['id']}: {run['state']} (exit {run['exit_code']})")
    if outcome.pushed:
        p = outcome.pushed
        render.say(f"revision: {p['missing']} of {p['files']} file(s) sent ({render.size(p['bytes'])})")
    ck = outcome.checkpoints
    if ck and ck.get("action") == "moved":
        render.say(f"checkpoints: {ck['moved']} file(s) moved to {ck['entry_path']} "
                   f"(orch checkpoints restore {ck['entry']})")
    elif ck and ck.get("action") == "purged":
        render.say(f"checkpoints: {ck.get('deleted', ck['moved'])} file(s) deleted")
        if ck.get("kept"):
            render.say(f"checkpoints: {len(ck['kept'])} file(s) written after the confirmation were moved to "
                       f"{ck['entry_path']}, not deleted (orch checkpoints restore {ck['entry']})")
    for p in (ck or {}).get("purged", []) or []:
        render.say(f"trash retention: deleted {p['entry']} ({render.size(p['bytes'])})")
    for sh in outcome.shell:
        if sh.get("stdout"):
            render.out(sh["stdout"].rstrip())
    if exp is not None:
        render.out(f"experiment {exp.id}: {exp.status} on {exp.target} (revision {exp.revision})")
        if exp.status == "crashed":
            render.say(f"it exited at once with code {exp.exit_code}: see orch logs -e {exp.id}")
            raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    @app.command()
    def deploy(ctx: typer.Context, target: TargetOpt = None, ct: CtOpt = None, message: MessageOpt = None,
               set_: SetOpt = None, clean_checkpoints: CleanOpt = False, purge: PurgeOpt = False,
               yes: YesOpt = False, dry_run: DryOpt = False, start: StartOpt = False,
               trust_new_host: TrustOpt = False, as_json: JsonOpt = False) -> None:
        """Push the code as a new revision and start it as a new experiment."""
        from .. import prepare

        settings = common.settings(ctx, set_)
        tgt = _target(settings, target, ct, start, trust_new_host, dry_run)
        confirm = render.confirm if render.interactive() else None
        launch = prepare.deploy(settings, tgt, message=message, clean=clean_checkpoints or purge, purge=purge,
                                yes=yes, confirm=confirm, echo=render.say)
        _run(launch, settings, dry_run, as_json)

    @app.command()
    def restart(ctx: typer.Context, target: TargetOpt = None, ct: CtOpt = None, message: MessageOpt = None,
                clean_checkpoints: CleanOpt = False, purge: PurgeOpt = False, yes: YesOpt = False,
                dry_run: DryOpt = False, start: StartOpt = False, trust_new_host: TrustOpt = False,
                as_json: JsonOpt = False) -> None:
        """Stop the latest experiment and relaunch its revision and settings as a new experiment."""
        from .. import prepare

        settings = common.settings(ctx)
        tgt = _target(settings, target, ct, start, trust_new_host, dry_run)
        confirm = render.confirm if render.interactive() else None
        with common.registry(settings) as reg:
            launch = prepare.restart(settings, tgt, reg, message=message, clean=clean_checkpoints or purge,
                                     purge=purge, yes=yes, confirm=confirm, echo=render.say)
        _run(launch, settings, dry_run, as_json)

    @app.command()
    def stop(ctx: typer.Context, target: TargetOpt = None, ct: CtOpt = None, dry_run: DryOpt = False,
             trust_new_host: TrustOpt = False, as_json: JsonOpt = False) -> None:
        """Stop the running experiment gracefully (SIGINT, then SIGTERM, then SIGKILL)."""
        from .. import prepare

        settings = common.settings(ctx)
        tgt = _target(settings, target, ct, False, trust_new_host, dry_run)
        launch = prepare.stop(settings, tgt, echo=render.say)
        if dry_run:
            return _run(launch, settings, True, as_json)
        from ..operations import execute

        with common.registry(settings) as reg:
            outcome = execute(launch, reg)
        if as_json:
            render.print_json({"stopped": outcome.stopped})
        elif not outcome.stopped:
            render.out("nothing was running")
        for run in outcome.stopped if not as_json else []:
            render.out(f"experiment {run['id']}: {run['state']} (exit {run['exit_code']}, "
                       f"signals: {', '.join(run['signals']) or 'none'})")

    @app.command()
    def play(ctx: typer.Context, file: Annotated[Path, typer.Argument(help="A playbook .yaml")],
             target: TargetOpt = None, ct: CtOpt = None, message: MessageOpt = None, set_: SetOpt = None,
             clean_checkpoints: CleanOpt = False, yes: YesOpt = False, dry_run: DryOpt = False,
             start: StartOpt = False, trust_new_host: TrustOpt = False, as_json: JsonOpt = False) -> None:
        """Run any playbook (a YAML list of steps) against a target."""
        from .. import prepare

        settings = common.settings(ctx, set_)
        tgt = _target(settings, target, ct, start, trust_new_host, dry_run)
        confirm = render.confirm if render.interactive() else None
        launch = prepare.play(settings, tgt, file, message=message, clean=clean_checkpoints, purge=False, yes=yes,
                              confirm=confirm, echo=render.say)
        _run(launch, settings, dry_run, as_json)
