"""Operations as ordered, typed steps: load a playbook, validate it, and plan it without I/O.

The built-in operations are YAML files shipped inside the package (``orchestrator/launch/builtin_playbooks/``,
read with ``importlib.resources``); a ``playbooks/`` folder beside orch.toml overrides them by name.
``plan()`` turns a playbook and the operation's inputs into human-readable steps (what ``--dry-run``
prints); ``operations.execute()`` then runs them.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from . import command as commands
from ..errors import ConfigError, InputError, NotFoundError

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


class PushRevision(_Step):
    step: Literal["push_revision"]


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
    wait: float = Field(0.1, ge=0, le=60)


class Shell(_Step):
    step: Literal["shell"]
    argv: list[str] = Field(min_length=1)
    cwd: Literal["root", "revision"] = "root"
    check: bool = True
    timeout: float = Field(600, gt=0)


Step = Annotated[Union[Preflight, PushRevision, StopRun, Checkpoints, Record, StartRun, VerifyStarted, Shell],
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


def load_file(path: Path | Traversable) -> Playbook:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NotFoundError(f"playbook {path} does not exist", hint="give the path of a .yaml playbook") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    try:
        book = Playbook.model_validate(data)
    except ValidationError as exc:
        lines = [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(f"{path}: invalid playbook:\n  " + "\n  ".join(lines),
                          hint="steps are preflight, push_revision, stop_run, checkpoints, record, start_run, "
                               "verify_started, shell (with argv: [...])") from None
    if book.has("start_run") and not book.has("record"):
        raise ConfigError(f"{path}: start_run needs a record step before it",
                          hint="every launch is recorded as an experiment")
    order = [s.step for s in book.steps]
    if "start_run" in order and order.index("record") > order.index("start_run"):
        raise ConfigError(f"{path}: the record step must come before start_run")
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


@dataclass
class Inputs:
    """Everything a plan depends on, gathered without touching the network."""

    target: str
    root: str
    checkpoints: str
    checkpoint_action: Literal["keep", "move", "purge"] = "keep"
    revision: str | None = None
    files: int = 0
    size: int = 0
    argv: list[str] | None = None  # what the target starts (command.exec_argv)
    command: str | list[str] | None = None  # as the user wrote it, and as it is recorded
    batching: dict | None = None
    parent: int | None = None
    message: str | None = None


def checkpoint_action(step: Checkpoints, inputs: Inputs) -> str:
    return inputs.checkpoint_action if step.action == "flags" else step.action


def plan(book: Playbook, inputs: Inputs) -> list[str]:
    """One line per step saying what it will do. Pure: no network, no files."""
    lines = []
    for i, step in enumerate(book.steps, 1):
        label = step.name or step.step
        if isinstance(step, Preflight):
            text = f"check python3 >= 3.10, tmux and {step.min_free_mb} MB free under {inputs.root}"
        elif isinstance(step, PushRevision):
            if not inputs.revision:
                raise InputError(f"playbook {book.name} pushes a revision but there is none to push")
            text = f"push revision {inputs.revision} ({inputs.files} files, {inputs.size} bytes; only missing ones)"
        elif isinstance(step, StopRun):
            text = "stop this project's running experiment, if any (SIGINT, then SIGTERM, then SIGKILL)"
        elif isinstance(step, Checkpoints):
            action = checkpoint_action(step, inputs)
            text = {"keep": f"keep the checkpoints in {inputs.checkpoints}",
                    "move": f"move the contents of {inputs.checkpoints} to its trash (restorable)",
                    "purge": f"DELETE the contents of {inputs.checkpoints} (move to trash, then purge)"}[action]
        elif isinstance(step, Record):
            parent = f", parent {inputs.parent}" if inputs.parent else ""
            text = f"record a new experiment (target {inputs.target}{parent})"
        elif isinstance(step, StartRun):
            strategy = (inputs.batching or {}).get("strategy", "?")
            shown = commands.display(inputs.command if inputs.command is not None else inputs.argv or [])
            how = f" as {shlex.join(inputs.argv or [])}" if isinstance(inputs.command, str) else ""
            text = f"start `{shown}`{how} in tmux (batching: {strategy})"
        elif isinstance(step, VerifyStarted):
            text = f"check the run is alive after {step.wait:g} s"
        else:
            assert isinstance(step, Shell)
            text = f"run {shlex.join(step.argv)} in the {step.cwd} folder" + ("" if step.check else " (may fail)")
        lines.append(f"{i}. {label}: {text}")
    return lines
