"""Who runs a launch's run on its target: one small interface, in the spirit of TorchX's schedulers, two kinds.

    Direct   orch's own supervisor, in tmux on each box: orch places a run (``--gpus``, ``--pool``, ``--beside``),
             keeps the target's queue (``--queue``), and a job is the containers the user names
    Slurm    a job submitted from a cluster's login node (``launch/slurm.py``, ``agent/run/slurm.py``): Slurm
             places it (``--gpus`` is ``--gres``, ``--nodes``) and Slurm is the queue

What a deploy or restart asks of it: ``resources`` (what the run asks the scheduler for), ``queued`` (how
``--queue`` submits), ``check`` (the op that asks, before anything changes, whether the run would be taken),
``submit`` (the start op's arguments: how the agent starts the run), ``recovery`` (what its supervisor may do
alone), ``started`` (how a started run is said). Its state, stop, nodes and run folder are the agent's ops
(``status``, ``run_stop``, ``slurm_nodes``), which read the run folder's own records.

    sched = scheduler.of(target)
    launch.resources = sched.resources(gpus, nodes)
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import InputError
from ..reach.agent_client import Op
from ..reach.targets import Target
from .model import Launch, StopRun


class Direct:
    """orch's supervisor in tmux on the target itself."""

    kind = "direct"
    places = True  # orch chooses the machine and the GPUs
    queues = False  # --queue: orch's own queue on the target

    def resources(self, gpus: int | None, nodes: int | None) -> dict | None:
        if nodes is not None:
            raise InputError("--nodes asks Slurm for nodes: it is for a kind = \"slurm\" target",
                             hint="a job over several CTs names them: --ct 200 --ct 201")
        return None

    def queued(self, launch: Launch) -> Launch:
        from .queueing import queued

        return queued(launch)

    def check(self, launch: Launch, exp, key: str | None) -> Op | None:
        return None

    def submit(self, launch: Launch, exp) -> dict:
        return {}

    def recovery(self, recovery: dict) -> dict:
        return recovery

    def started(self, exp, outcome, label: str) -> str | None:
        return None  # said by the CLI as it waited for the run


class Slurm(Direct):
    """A Slurm job whose steps run the same supervisor on the allocated nodes."""

    kind = "slurm"
    places = False  # --gpus is the job's --gres: Slurm chooses the node
    queues = True  # Slurm is the queue: a job pending for its nodes is what the cluster runs next

    def resources(self, gpus: int | None, nodes: int | None) -> dict | None:
        return {"gpus": gpus, "nodes": nodes}

    def queued(self, launch: Launch) -> Launch:
        """Submitted without stopping the project's running job: Slurm queues it."""
        return replace(launch, actions=tuple(a for a in launch.actions if not isinstance(a, StopRun)))

    def check(self, launch: Launch, exp, key: str | None) -> Op | None:
        """``sbatch --test-only``: whether Slurm takes the job (partition, account, GPUs)."""
        return Op("slurm_check", {"exp_id": exp.id, "registry": key} | self.submit(launch, exp)["slurm_job"])

    def submit(self, launch: Launch, exp) -> dict:
        from . import slurm

        command = launch.inputs.command if launch.inputs.command is not None else launch.inputs.argv or []
        return {"slurm_job": slurm.job_spec(launch.target, launch.settings.project.name, exp.id, launch.resources)
                | slurm.launcher(launch.settings, command, exp.id, launch.resources)}

    def recovery(self, recovery: dict) -> dict:
        return recovery | {"resume_after_reboot": False}  # no unit of orch's on a compute node: a requeue brings
        # the run back

    def started(self, exp, outcome, label: str) -> str | None:
        if not (exp.target_info or {}).get("slurm"):
            return None
        from .slurm import describe, state_words

        return (f"experiment {exp.id}: {state_words(exp.status, (outcome.queue or {}).get('slurm'))} on {label} "
                f"as {describe(exp.target_info)} (revision {exp.revision}); orch status and orch logs --follow "
                "show it")


DIRECT, SLURM = Direct(), Slurm()


def of(target: Target) -> Direct:
    """The scheduler of a resolved target."""
    return SLURM if target.spec.kind == "slurm" else DIRECT


def named(settings, names: list[str] | None, cts: list[int] | None) -> Direct:
    """The scheduler of the one target the flags name (or the default), before it is resolved; several targets
    or CTs are a job of the direct kind."""
    if cts or len(names or []) > 1:
        return DIRECT
    spec = settings.targets.get((names or [None])[0] or settings.default_target)
    return SLURM if spec is not None and spec.kind == "slurm" else DIRECT
