"""Options shared by commands, and the one way a command gets settings, target and registry."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

TargetOpt = Annotated[Optional[str], typer.Option("--target", "-t", help="Target name from orch.toml")]
ID_MAX = 2**63 - 1  # SQLite's largest integer: an experiment id beyond it is bad input, not a crash
IdArg = Annotated[int, typer.Argument(metavar="ID", min=1, max=ID_MAX)]
IdsArg = Annotated[list[int], typer.Argument(metavar="ID...", min=1, max=ID_MAX, help="Two or more ids")]
CT_MAX = 999999999  # Proxmox's largest CT id
CtOpt = Annotated[Optional[int], typer.Option("--ct", min=1, max=CT_MAX,
                                              help="Proxmox CT id (needs a [proxmox] section)")]
TargetsOpt = Annotated[Optional[list[str]], typer.Option(
    "--target", "-t", help="Target name from orch.toml; repeat it (or name a kind = \"group\" target) for a job "
                           "over several nodes, node 0 first")]
CtsOpt = Annotated[Optional[list[int]], typer.Option(
    "--ct", min=1, max=CT_MAX,
    help="Proxmox CT id (needs a [proxmox] section); repeat it for a job over several CTs, node 0 first")]
StartOpt = Annotated[bool, typer.Option("--start", help="Start the CT if it is stopped")]
TrustOpt = Annotated[bool, typer.Option("--trust-new-host", help="Accept and record an unknown SSH host key "
                                        "(a changed key is always refused)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print only JSON on stdout")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="Override a setting: section.key=value")]


def settings(ctx: typer.Context, overrides: list[str] | None = None, *, lenient: bool = False):
    """The merged settings; ``lenient`` (status, logs, stop, attach): a key in error is warned of and left at its
    default, so that a typo never keeps a user from looking at or stopping a run."""
    from ..config import load_settings

    from ..errors import ConfigError

    path: Path | None = (ctx.obj or {}).get("config") if ctx.obj else None
    settings = load_settings(path, overrides=overrides or [], lenient=lenient,
                             recorded=last_launched if lenient else None)
    if settings.config_path is None:  # records live beside orch.toml: never scatter them in random folders
        raise ConfigError(f"no orch.toml in {Path.cwd()} or any folder above it",
                          hint="run `orch init` in your project folder, or pass --config PATH")
    return settings


def last_launched(state_dir: Path):
    """The settings the project's running experiment (else its newest one) was launched with, read from the
    registry beside orch.toml, for a ``lenient`` command whose orch.toml cannot be read; None when there is none."""
    from ..config import Recorded
    from ..errors import OrchError
    from ..records.experiments import Registry

    if not (state_dir / "experiments.db").is_file():
        return None
    try:
        with Registry(state_dir / "experiments.db", read_only=True) as reg:
            exp = next(reg.newest(status="running", limit=1), None) or \
                next((e for e in reg.newest(limit=50) if e.config), None)
    except OrchError:
        return None  # a registry orch cannot read: the command goes on with the defaults, and says so
    return Recorded(exp.id, exp.config, exp.target) if exp is not None and exp.config else None


def read_only(settings):
    """The settings for a read-only command: its agent calls are bounded by ``[ssh] read_timeout``."""
    ssh = settings.ssh.model_copy(update={"command_timeout": settings.ssh.read_timeout})
    return settings.model_copy(update={"ssh": ssh})


def target(settings, name: str | None, ct: int | None, *, start: bool = False, trust: bool = False,
           resolve: bool = True):
    """The target the flags (or the current target) name; ``resolve=False`` skips every lookup.

    When a ``--ct`` matches several entries, the current target's entry is preferred.
    """
    from ..reach import current
    from ..reach.targets import planned_target, resolve_target, target_spec
    from . import render

    chosen = current.load(settings.state_dir) or {}
    name, ct = current.acting_on(settings, name, ct, chosen)
    prefer = chosen.get("target")
    if not resolve:
        return planned_target(settings, *target_spec(settings, name, ct, render.say, prefer))
    from ..reach.agent_client import connect_early

    confirm = render.confirm if render.interactive() else None
    tgt = resolve_target(settings, name, ct, trust_new_host=trust, start=start, confirm=confirm, notice=render.say,
                         prefer=prefer)
    # the login and the agent's start go on while the command prepares its first request
    connect_early(tgt, [p for p in (settings.config_path, settings.state_dir / current.FILE) if p is not None])
    return tgt


def remember(settings, name: str | None, ct: int | None, tgt) -> None:
    """After a successful launch named by flags: make its target the project's current one."""
    from ..reach import current

    if name is None and ct is None:
        return
    if tgt.name in settings.targets:  # a configured entry (also when --ct picked one)
        current.save(settings.state_dir, tgt.name, None)
    else:
        current.save(settings.state_dir, None, ct)


def registry(settings):
    """The project's registry; with ``[mlflow] mirror``, what a command changes in it goes to MLflow too."""
    from ..records.experiments import Registry
    from . import render

    mirror = None
    if settings.mlflow.mirror:
        from ..watch.mlflow_export import mirror as to_mlflow

        def mirror(reg, ids):
            to_mlflow(settings, reg, ids, notice=render.say)
    return Registry(settings.state_dir / "experiments.db", notice=render.say, mirror=mirror,
                    lock_wait=settings.run.registry_timeout, park=True)


def for_plan(resolve, *, dry_run: bool, start: bool, trust: bool, where: str):
    """``resolve(start=, trust=, resolve=)``'s answer; a dry run that cannot reach ``where`` still shows the plan."""
    from ..errors import OrchError
    from . import render

    if not dry_run:
        return resolve(start=start, trust=trust)
    try:
        return resolve(trust=trust)
    except OrchError as exc:
        if exc.exit_code != 3:
            raise
        render.say(f"orch: {exc.message}: showing the plan without what is on {where}")
        planned = resolve(resolve=False)
        if planned is not None:
            planned.unasked = exc
        return planned


def unasked(exc, where: str):
    """The error a dry run ends with when it could not ask ``where``: the plan was shown, the target's state was not.

    It keeps the failure's exit code (3: unreachable), so a script never takes an unchecked plan for a checked one.
    """
    from ..errors import OrchError

    error = OrchError(f"the dry run could not ask {where}: {exc.message}",
                      hint=(exc.hint + "; " if exc.hint else "") + "the plan above leaves out what is on the target")
    error.exit_code = exc.exit_code
    return error


def group(settings, names: list[str] | None, cts: list[int] | None, *, start: bool = False, trust: bool = False,
          resolve: bool = True):
    """The nodes of a job when the flags (or the current target) name several, else None.

    Repeated flags name them in order, ``--target`` ones first; so does a ``kind = "group"`` target.
    """
    from ..reach import current

    names, cts, recorded = list(names or []), list(cts or []), None
    if not names and not cts:
        chosen = current.load(settings.state_dir) or {}
        recorded = chosen.get("nodes")
        names = [chosen["target"]] if chosen.get("target") in settings.targets else []
    named = settings.targets.get(names[0]) if names else None
    if len(names) + len(cts) < 2 and getattr(named, "kind", None) != "group" and len(recorded or []) < 2:
        return None  # one target: the job layer (and the launch machinery it imports) is not needed
    from ..launch.multinode import group_for

    return group_for(settings, names, cts,
                     lambda n, c: target(settings, n, c, start=start, trust=trust, resolve=resolve), recorded)


def job_group(settings, exp, *, trust: bool = False):
    """The nodes a recorded job ran on, named as it named them."""
    from ..launch.multinode import group_for

    if exp.target in settings.targets:  # a kind = "group" target
        return group(settings, [exp.target], None, trust=trust)
    recorded = [{"target": n["target"]} if n.get("target") in settings.targets or n.get("ct") is None
                else {"ct": n["ct"]} for n in exp.nodes]
    return group_for(settings, [], [], lambda n, c: target(settings, n, c, trust=trust), recorded)


def one_node(names: list[str] | None, cts: list[int] | None, what: str) -> tuple[str | None, int | None]:
    """The one ``--target``/``--ct`` of a command that acts on one machine; several are refused, not guessed."""
    if len(names or []) + len(cts or []) > 1:
        from ..errors import InputError

        raise InputError(f"orch {what} acts on one node at a time, and several were named",
                         hint=f"name one of them, e.g. orch {what} --ct {(cts or [201])[-1]}")
    return single(names, cts)


def single(names: list[str] | None, cts: list[int] | None) -> tuple[str | None, int | None]:
    """The one ``--target``/``--ct`` a one-target command got (a group target stands for its node 0)."""
    return (names or [None])[0], (cts or [None])[0]


def remember_group(settings, grp) -> None:
    """After a successful job launch: its nodes become the project's current target."""
    from ..reach import current

    if grp.configured:
        current.save(settings.state_dir, grp.name, None)
    else:
        current.save(settings.state_dir, None, None, nodes=grp.flags)
