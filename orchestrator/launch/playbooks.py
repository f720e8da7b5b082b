"""Operations as ordered, typed steps: load a playbook, validate it, and plan it without I/O.

The built-in operations are YAML files shipped inside the package (``orchestrator/launch/builtin_playbooks/``,
read with ``importlib.resources``); a ``playbooks/`` folder beside orch.toml overrides them by name.
``plan()`` turns a playbook and the operation's inputs into typed actions (``model``): what ``--dry-run``
prints, and what ``operations.execute()`` (one target) and ``multinode.deploy()`` (every node of a job) run.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from . import model
from ..errors import ConfigError, InputError, NotFoundError
from .model import Inputs

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

BUILTIN_PACKAGE = "orchestrator.launch"
BUILTIN_FOLDER = "builtin_playbooks"


class _Step(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = None


class Preflight(_Step):
    step: Literal["preflight"]
    min_free_mb: int = Field(50, ge=0)


class Doctor(_Step):
    step: Literal["doctor"]


class PushRevision(_Step):
    step: Literal["push_revision"]


class BuildEnv(_Step):
    step: Literal["build_env"]


class StopRun(_Step):
    step: Literal["stop_run"]


class Checkpoints(_Step):
    step: Literal["checkpoints"]
    action: Literal["flags", "keep", "move", "purge"] = "flags"


class Record(_Step):
    step: Literal["record"]


class StartRun(_Step):
    step: Literal["start_run"]


class VerifyStarted(_Step):
    step: Literal["verify_started"]
    # 0: done once the command is spawned (an exit after that is the next command's and --wait's to report);
    # more: it must also live that long, or the launch fails as crashed
    wait: float = Field(0.0, ge=0, le=60)


class Shell(_Step):
    step: Literal["shell"]
    argv: list[str] = Field(min_length=1)
    cwd: Literal["root", "revision", "work"] | None = None  # None: work once the run is recorded, else root
    check: bool = True
    timeout: float = Field(600, gt=0)


Step = Annotated[Union[Preflight, Doctor, PushRevision, BuildEnv, StopRun, Checkpoints, Record, StartRun, VerifyStarted,
                       Shell],
                 Field(discriminator="step")]


class Playbook(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str = ""
    steps: list[Step] = Field(min_length=1)

    def has(self, kind: str) -> bool:
        return any(s.step == kind for s in self.steps)


def builtin_dir() -> Traversable:
    """The folder of built-in playbooks inside the installed package."""
    from importlib import resources

    return resources.files(BUILTIN_PACKAGE) / BUILTIN_FOLDER


def builtin_names() -> list[str]:
    return sorted(p.name[:-5] for p in builtin_dir().iterdir() if p.name.endswith(".yaml"))


def copy_builtin(dest: Path, force: bool = False) -> list[Path]:
    """Write the built-in playbooks into ``dest`` (a project's ``playbooks/``) to be edited there."""
    names = builtin_names()
    clash = [dest / f"{n}.yaml" for n in names if (dest / f"{n}.yaml").exists()]
    if clash and not force:
        raise InputError(f"{', '.join(str(p) for p in clash)} already exist{'s' if len(clash) == 1 else ''}",
                         hint="pass --force to overwrite them with the built-in ones")
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for name in names:
        path = dest / f"{name}.yaml"
        path.write_text((builtin_dir() / f"{name}.yaml").read_text(encoding="utf-8"), encoding="utf-8")
        written.append(path)
    return written


_LOADED: dict[str, Playbook] = {}  # a playbook's text -> its checked form: the warm process reads each one once


def load_file(path: Path | Traversable) -> Playbook:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise NotFoundError(f"playbook {path} does not exist", hint="give the path of a .yaml playbook") from None
    if text not in _LOADED:
        _LOADED[text] = _parse(path, text)
    return _LOADED[text].model_copy(deep=True)  # a caller's changes never reach the next command's copy


def _parse(path: Path | Traversable, text: str) -> Playbook:
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    try:
        book = Playbook.model_validate(data)
    except ValidationError as exc:
        lines = [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(f"{path}: invalid playbook:\n  " + "\n  ".join(lines),
                          hint="steps are preflight, doctor, push_revision, build_env, stop_run, checkpoints, record, "
                               "start_run, verify_started, shell (with argv: [...])") from None
    if book.has("start_run") and not book.has("record"):
        raise ConfigError(f"{path}: start_run needs a record step before it",
                          hint="every launch is recorded as an experiment")
    order = [s.step for s in book.steps]
    if "start_run" in order and order.index("record") > order.index("start_run"):
        raise ConfigError(f"{path}: the record step must come before start_run")
    for i, step in enumerate(book.steps):
        if isinstance(step, Shell) and step.cwd == "work" and not _run_made_before(book, i):
            raise ConfigError(f"{path}: step {i + 1} (shell, cwd: work) runs in the new run's work folder, so it "
                              "must come after the record step (and after push_revision)",
                              hint="move the step down, or give it cwd: root")
    return book


def load(name: str, project_dir: Path | None) -> Playbook:
    """The project's own ``playbooks/<name>.yaml`` if present, else the built-in one."""
    folders: list[Path | Traversable] = [project_dir / "playbooks"] if project_dir else []
    for folder in folders + [builtin_dir()]:
        path = folder / f"{name}.yaml"
        if path.is_file():
            return load_file(path)
    raise NotFoundError(f"no playbook named {name!r}",
                        hint=f"the built-in ones are {', '.join(builtin_names())}; a project's own go in "
                             "playbooks/ beside orch.toml (orch init --playbooks copies the built-in ones there)")


def checkpoint_action(step: Checkpoints, inputs: Inputs) -> str:
    return inputs.checkpoint_action if step.action == "flags" else step.action


def shell_cwd(book: Playbook, index: int) -> str:
    """Where the shell step at ``index`` runs: as it says, else the new run's work folder once the playbook
    has recorded the run (and assembled its revision) before it, else orch's root."""
    step = book.steps[index]
    assert isinstance(step, Shell)
    if step.cwd is not None:
        return step.cwd
    return "work" if _run_made_before(book, index) else "root"


def _run_made_before(book: Playbook, index: int) -> bool:
    """Whether the steps before ``index`` record the new run and assemble its revision (if the book pushes one)."""
    before = [s.step for s in book.steps[:index]]
    return "record" in before and ("push_revision" in before or not book.has("push_revision"))


def plan(book: Playbook, inputs: Inputs, nodes: int = 1) -> tuple[model.Action, ...]:
    """The typed actions the playbook's steps become for these inputs (``nodes``: a job's). Pure: no I/O."""
    actions: list[model.Action] = []
    for i, step in enumerate(book.steps):
        label = step.name or step.step
        if isinstance(step, Preflight):
            actions.append(model.Preflight(label=label, root=inputs.root, min_free_mb=step.min_free_mb))
        elif isinstance(step, Doctor):
            actions.append(model.Doctor(label=label))
        elif isinstance(step, PushRevision):
            if not inputs.revision:
                raise InputError(f"playbook {book.name} pushes a revision but there is none to push")
            actions.append(model.PushRevision(label=label, revision=inputs.revision, files=inputs.files,
                                              size=inputs.size))
        elif isinstance(step, BuildEnv):
            if inputs.env is not None:  # no [env]: the run uses the target's own python, nothing to build
                env = inputs.env
                actions.append(model.BuildEnv(label=label, source=env["source"], python=env.get("python"),
                                              requirements=len(env.get("names") or []), wheels=env["wheels"],
                                              nodes=nodes))
        elif isinstance(step, StopRun):
            actions.append(model.StopRun(label=label))
        elif isinstance(step, Checkpoints):
            actions.append(model.Checkpoints(label=label, path=inputs.checkpoints,
                                             action=checkpoint_action(step, inputs)))  # type: ignore[arg-type]
        elif isinstance(step, Record):
            actions.append(model.Record(label=label, target=inputs.target, parent=inputs.parent))
        elif isinstance(step, StartRun):
            command = inputs.command if inputs.command is not None else inputs.argv or []
            actions.append(model.StartRun(label=label, command=command if isinstance(command, str) else tuple(command),
                                          argv=tuple(inputs.argv or []),
                                          strategy=str((inputs.batching or {}).get("strategy", "")), nodes=nodes))
        elif isinstance(step, VerifyStarted):
            actions.append(model.VerifyStarted(label=label, wait=step.wait))
        else:
            assert isinstance(step, Shell)
            cwd = shell_cwd(book, i)
            actions.append(model.Shell(label=label, argv=tuple(step.argv), cwd=cwd,  # type: ignore[arg-type]
                                       check=step.check, timeout=step.timeout, nodes=nodes))
    return tuple(actions)
