"""Build the ``Launch`` of each operation from settings and flags, without touching the target."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from . import envs, notify, playbooks, revisions, sources
from .. import checkpoints, secrets
from ..config import Settings
from ..errors import InputError, NotFoundError
from ..records.experiments import Experiment, Registry
from .command import exec_argv, missing, runs_file
from .limits import check as check_limits
from .meter import Meter
from .model import Inputs, Launch
from .playbooks import Playbook
from .push import BULK as STREAM_FROM  # hashed while sent from the size that goes the bulk way
from ..reach.targets import Target


def resolve_batching(settings: Settings) -> tuple[dict, dict | None]:
    """The batching table handed to the run; with declared lengths, optimized and planned first. A project with
    no ``[batching]`` (nor a ``batching.`` flag or variable) has none: nothing is recorded for it."""
    if "batching" not in settings.model_fields_set:
        return {}, None
    config = settings.batching.model_dump()
    if not settings.batching.lengths:
        return config, None
    from .. import batching

    path = Path(settings.batching.lengths)
    if not path.is_absolute():
        path = settings.project_dir / path
    try:
        lengths = batching.load_lengths(str(path))
        resolved = batching.resolve(lengths, config)
    except FileNotFoundError:
        raise InputError(f"[batching] lengths file {path} does not exist",
                         hint="fix [batching] lengths or remove it") from None
    except ValueError as exc:
        raise InputError(f"[batching]: {exc}", hint="check [batching] in orch.toml and the lengths file") from None
    out = dict(config)
    out.update(resolved["config"])
    out["lengths"] = settings.batching.lengths
    return out, resolved["planned"]


def secret_values(settings: Settings, names: list[str] | None = None) -> secrets.SecretValues:
    """The values of the named secrets (default: ``[project] secrets``); an error before anything changes."""
    return secrets.collect(settings.project.secrets if names is None else names, settings.state_dir)


def _env(env: dict, echo: Callable[[str], None]) -> dict:
    """``[project] env`` as handed to the run, with one warning for keys that look like secrets."""
    suspicious = secrets.looks_secret(env)
    if suspicious:
        what = "looks like a secret" if len(suspicious) == 1 else "look like secrets"
        echo(f"warning: [project] env {', '.join(suspicious)} {what}: env values are recorded and written to the "
             "run folder; name them in [project] secrets and keep the values in the environment or .orch/secrets.env")
    return dict(env)


def deploy(settings: Settings, target: Target, *, message: str | None, clean: bool, purge: bool, yes: bool,
           confirm: Callable[[str], bool] | None, echo: Callable[[str], None],
           book: Playbook | None = None, secret: secrets.SecretValues | None = None,
           progress: Meter | None = None, stream: bool = False) -> Launch:
    """The launch of a deploy; ``stream``: a big tree not hashed yet is hashed while it is pushed (its revision
    is pending until then: only a launch that pushes before anything else needs its id may ask for that)."""
    secret = secret_values(settings) if secret is None else secret
    book = book or playbooks.load("deploy", settings.project_dir)
    rev = revisions.build(settings.project_dir, settings.project.sources, settings.state_dir,
                          follow_symlinks=settings.project.follow_symlinks, progress=progress,
                          defer=STREAM_FROM if stream and book.has("push_revision") else None)
    for line in sources.left_out_warning(rev.left_out):
        echo(line)
    check_entry(settings, rev)
    batching, planned = resolve_batching(settings)
    if settings.env.active and not book.has("build_env"):
        echo(f"warning: playbook {book.name} has no build_env step: [env] is not built, and the run uses the "
             "target's own python (add `- step: build_env` after push_revision)")
    inputs = Inputs(target=target.name, root=target.root, checkpoints=target.checkpoints,
                    checkpoint_action=_action(clean, purge), revision=rev.id or revisions.PENDING,
                    files=len(rev.files), size=rev.size, argv=exec_argv(settings.project.command),
                    command=settings.project.command, batching=batching, message=message,
                    env=envs.spec(settings) if book.has("build_env") else None)
    launch = Launch(settings, target, book, inputs, playbooks.plan(book, inputs), revision=rev,
                    env=_env(settings.project.env, echo),
                    secrets=secret, config=_public_config(settings), batching_plan=planned, yes=yes,
                    confirm=confirm, echo=echo, progress=progress)
    check_limits(launch)  # what the agent would refuse, before anything is asked or stopped
    notify.check(settings)
    return launch


def check_entry(settings: Settings, rev: revisions.Revision) -> None:
    """Refuse a command that names a script (or a module of the project's own) the revision does not hold: it
    would start, die at once on ``can't open file`` and read as a run that failed."""
    command = settings.project.command
    found = runs_file(command)
    absent = missing(found, {f["path"] for f in rev.files}, settings.project.env.get("PYTHONPATH", "").split(":")) \
        if found is not None else None
    if absent is None:
        return
    shown = command if isinstance(command, str) else " ".join(command)
    unset = "command" not in settings.project.model_fields_set
    what = (f"[project] command is not set, and orch's default {shown!r}" if unset
            else f"[project] command {shown!r}") + f" runs {absent}, which is not among the {len(rev.files)} " \
        f"file(s) of the revision"
    left = next((lo for lo in rev.left_out if lo.path == absent or (lo.path.endswith("/") and
                                                                    absent.startswith(lo.path))), None)
    if left is not None:
        hint = f"{left.path} is left out by {left.rule}: the line !{left.path} in .orchignore sends it"
    elif (settings.project_dir / absent).is_file():
        hint = f"add {absent} to [project] sources in orch.toml (it sends {', '.join(settings.project.sources)})"
    else:
        from .starter import survey

        seen = survey(settings.project_dir)
        found_here = seen.candidates or ([seen.command] if isinstance(seen.command, str) else [])
        where = f"; found in the project: {', '.join(found_here[:6])}" if found_here else ""
        hint = f"set [project] command in orch.toml to what starts the training{where}"
    raise InputError(what, hint=hint + "; nothing was changed on the target")


def _check_parent(parent: Experiment, pythonpath: str) -> None:
    """A restart runs the parent's command on the parent's revision: refused when that revision lacks the script
    (an experiment launched before deploys checked it, which died on ``can't open file``)."""
    found = runs_file(parent.command)
    files = {f["path"] for f in parent.revision_files if isinstance(f, dict) and "path" in f}
    absent = missing(found, files, pythonpath.split(":")) if found is not None and files else None
    if absent is not None:
        shown = parent.command if isinstance(parent.command, str) else " ".join(parent.command)
        raise InputError(f"experiment {parent.id}'s command {shown!r} runs {absent}, which its revision "
                         f"{parent.revision} does not hold", hint="fix [project] command (or sources) in orch.toml "
                         "and orch deploy a new revision; nothing was changed on the target")


def restart(settings: Settings, target: Target, registry: Registry, *, message: str | None, clean: bool,
            purge: bool, yes: bool, confirm: Callable[[str], bool] | None, echo: Callable[[str], None],
            parent: Experiment | None = None, job: bool | None = None) -> Launch:
    """Relaunch ``parent`` (default: the target's latest experiment); a job's row is given by the caller (``job``
    unless said otherwise: ``orch restart -e ID`` gives one run's)."""
    job = parent is not None if job is None else job
    parent = parent or registry.latest(target.machine, target.name,
                                      queued=target.spec.kind == "slurm")  # a pending job is restarted too
    if parent is None:
        raise NotFoundError(f"nothing to restart: no experiment on {target.label}",
                            hint="use orch deploy first (or orch use to pick the target you deployed to)")
    if parent.nodes and not job:
        raise InputError(f"experiment {parent.id} is a job over {len(parent.nodes)} nodes: restart relaunches "
                         "one target", hint="deploy the job again naming its nodes (orch deploy --ct A --ct B)")
    if not job:  # where the parent ran: its root and checkpoint folder, whatever orch.toml says today
        target = checkpoints.ran_with(target, parent)
    project = parent.config.get("project") or {}
    _check_parent(parent, str((project.get("env") or {}).get("PYTHONPATH", "")))
    secret = secret_values(settings, list(project.get("secrets") or []))  # the parent's, as its env
    book = playbooks.load("restart", settings.project_dir)
    inputs = Inputs(target=target.name, root=target.root,
                    checkpoints=target.checkpoints, checkpoint_action=_action(clean, purge),
                    revision=parent.revision, files=len(parent.revision_files),
                    size=sum(f.get("size", 0) for f in parent.revision_files), argv=exec_argv(parent.command),
                    command=parent.command, batching=parent.batching, parent=parent.id,
                    message=message or parent.message,
                    env=(parent.env or {}).get("spec"))  # the parent's environment, built again if it is gone
    env = _env(project.get("env") or {}, echo)
    launch = Launch(settings, target, book, inputs, playbooks.plan(book, inputs), revision=None, env=env,
                    secrets=secret, config=checkpoints.config_with(parent, target.checkpoints),
                    batching_plan=parent.batching_plan, yes=yes, confirm=confirm, echo=echo,
                    inherited={"revision_files": parent.revision_files, "git_commit": parent.git_commit,
                               "git_dirty": parent.git_dirty, "git_diff": parent.git_diff})
    check_limits(launch)
    notify.check(settings)
    return launch


def stop(settings: Settings, target: Target, *, echo: Callable[[str], None]) -> Launch:
    book = playbooks.load("stop", settings.project_dir)
    inputs = Inputs(target=target.name, root=target.root,
                    checkpoints=target.checkpoints)
    return Launch(settings, target, book, inputs, playbooks.plan(book, inputs), echo=echo)


def launches(path: Path) -> bool:
    """Whether the playbook at ``path`` pushes a revision or starts a run (then it is built as a deploy)."""
    book = playbooks.load_file(path)
    return book.has("push_revision") or book.has("start_run")


def play(settings: Settings, target: Target, path: Path, **kw) -> Launch:
    book = playbooks.load_file(path)
    if book.has("push_revision") or book.has("start_run"):
        return deploy(settings, target, book=book, **kw)
    inputs = Inputs(target=target.name, root=target.root,
                    checkpoints=target.checkpoints,
                    checkpoint_action=_action(kw.get("clean", False), kw.get("purge", False)))
    launch = Launch(settings, target, book, inputs, playbooks.plan(book, inputs), yes=kw.get("yes", False),
                    confirm=kw.get("confirm"),
                    echo=kw.get("echo", lambda _m: None), progress=kw.get("progress"))
    check_limits(launch)  # its shell steps, as the agent takes them
    return launch


def _action(clean: bool, purge: bool) -> str:
    return "purge" if purge else ("move" if clean else "keep")


def _public_config(settings: Settings) -> dict:
    """The fully resolved settings as recorded; secrets are never settings (only their names), so this is safe.
    A project with no ``[batching]`` records none (not the defaults it never read)."""
    return settings.model_dump(mode="json", exclude=None if "batching" in settings.model_fields_set else {"batching"})
