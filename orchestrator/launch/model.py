"""The launch's data: its inputs, the typed actions a playbook's plan is made of, the ``Launch`` and its ``Outcome``.

Imports none of the other launch modules: ``playbooks.plan()`` builds the actions, ``operations`` and
``multinode`` run them, ``result`` and ``way_back`` read them, and the CLI renders them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Literal

if TYPE_CHECKING:
    from ..config import Settings
    from ..reach.targets import Target
    from ..records.experiments import Experiment
    from .meter import Meter


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
    env: dict | None = None  # the run's environment ([env]: envs.spec), as it is recorded


@dataclass(frozen=True, kw_only=True)
class Action:
    """One step of a plan; ``label`` is the step's name in the playbook (its kind unless named)."""

    kind: ClassVar[str] = ""
    label: str


@dataclass(frozen=True, kw_only=True)
class Preflight(Action):
    kind: ClassVar[str] = "preflight"
    root: str
    min_free_mb: int


@dataclass(frozen=True, kw_only=True)
class Doctor(Action):
    """``orch doctor``'s quick checks (no torch): a ``fail`` refuses the launch before anything changes."""

    kind: ClassVar[str] = "doctor"


@dataclass(frozen=True, kw_only=True)
class PushRevision(Action):
    kind: ClassVar[str] = "push_revision"
    revision: str
    files: int
    size: int


@dataclass(frozen=True, kw_only=True)
class BuildEnv(Action):
    """The run's Python environment, built on the target unless it is there, before anything stops."""

    kind: ClassVar[str] = "build_env"
    source: str  # requirements.txt, pyproject.toml, uv.lock
    requirements: int  # how many lines name a package
    python: str | None
    wheels: str  # auto, push, index
    nodes: int = 1


@dataclass(frozen=True, kw_only=True)
class StopRun(Action):
    kind: ClassVar[str] = "stop_run"


@dataclass(frozen=True, kw_only=True)
class Checkpoints(Action):
    kind: ClassVar[str] = "checkpoints"
    path: str
    action: Literal["keep", "move", "purge"]


@dataclass(frozen=True, kw_only=True)
class Record(Action):
    kind: ClassVar[str] = "record"
    target: str
    parent: int | None = None


@dataclass(frozen=True, kw_only=True)
class StartRun(Action):
    kind: ClassVar[str] = "start_run"
    command: str | tuple[str, ...]  # as written (a list becomes a tuple)
    argv: tuple[str, ...]  # what the target starts
    strategy: str
    nodes: int = 1  # a job: started on every node, node 0 first


@dataclass(frozen=True, kw_only=True)
class QueueRun(StartRun):
    """``deploy --queue``: the start handed to the target's queue, run when the experiment before it ends."""

    kind: ClassVar[str] = "queue_run"
    start_idle: bool = True  # with nothing running, start the queue now (a sweep: only once every variant is in)


@dataclass(frozen=True, kw_only=True)
class VerifyStarted(Action):
    kind: ClassVar[str] = "verify_started"
    wait: float


@dataclass(frozen=True, kw_only=True)
class Shell(Action):
    """An argument list run on the target; ``cwd`` ``work`` is the new run's work folder (made for it)."""

    kind: ClassVar[str] = "shell"
    argv: tuple[str, ...]
    cwd: Literal["root", "revision", "work"]
    check: bool
    timeout: float
    nodes: int = 1  # a job: run on every node


def has(actions: tuple[Action, ...] | list[Action], kind: type[Action]) -> bool:
    return any(isinstance(a, kind) for a in actions)


def checkpoint_action(actions: tuple[Action, ...] | list[Action]) -> str:
    """What the plan does with the checkpoint folder: keep (no checkpoints step), move or purge."""
    return next((a.action for a in actions if isinstance(a, Checkpoints)), "keep")


@dataclass
class Launch:
    """One operation, fully resolved before any I/O: what ``--dry-run`` shows, and ``actions`` what runs."""

    settings: Settings
    target: Target
    book: Any  # playbooks.Playbook, as loaded: its name and steps
    inputs: Inputs
    actions: tuple[Action, ...] = ()  # playbooks.plan(book, inputs)
    revision: Any = None  # revisions.Revision, the one pushed (None: a restart's, already on the target)
    env: dict = field(default_factory=dict)
    secrets: dict = field(default_factory=dict, repr=False)  # name -> value: only ever sent in the agent's stdin
    config: dict = field(default_factory=dict)
    batching_plan: dict | None = None
    inherited: dict = field(default_factory=dict)  # a restart's revision files and git facts, from its parent
    yes: bool = False
    confirm: Callable[[str], bool] | None = None
    echo: Callable[[str], None] = lambda _msg: None
    wait: float = 0.0  # seconds to watch a started run for its first metric line
    progress: Meter | None = None  # counts a big push (the CLI's bar on a terminal)
    gpus: list | None = None  # the GPUs placement chose (index, uuid): in CUDA_VISIBLE_DEVICES and the record
    venv: dict | None = None  # the env the run starts in, once it is on the target (envs.prepare)
    sweep: str | None = None  # the sweep this launch is a variant of (launch/sweep.py)
    in_folder: bool = False  # runs in the target's checkpoint folder as given, even as a sweep's or beside run: a
    # resumed trial goes on in its pruned run's own folder (orch sweep resume --trial)
    guard: bool = False  # --guard: the new run is watched against the one it replaces ([guard])
    beside: dict | None = None  # --beside: {"gpus": N, "total": M}, started next to the running ones (beside.py)
    stop_ids: list | None = None  # stop_run stops these experiments only (orch stop -e ID); None: all the project's
    resources: dict | None = None  # what the run asks its scheduler for (scheduler.py): Slurm's {"gpus", "nodes"}

    def has(self, kind: type[Action]) -> bool:
        return has(self.actions, kind)


@dataclass
class Outcome:
    experiment: Experiment | None = None
    stopped: list = field(default_factory=list)
    settled: list = field(default_factory=list)  # stop -e N of runs the target does not know: (id, why)
    checkpoints: dict | None = None
    pushed: dict = field(default_factory=dict)
    shell: list = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    waited: dict | None = None  # what --wait saw: the first metric line, or how the run ended
    undo: dict = field(default_factory=dict)  # registry fields after a failed apply (checkpoints put back)
    queue: dict | None = None  # deploy --queue: what the target's queue said (queued at which position)
    guard: dict | None = None  # a guarded launch's spec, as its supervisor gets it (launch.guarded)
    verdict: dict | None = None  # what --wait saw of the guard
