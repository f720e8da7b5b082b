"""``orch deploy --gpus N --beside``: a new experiment next to the project's running ones, on GPUs none holds.

The target says which of its GPUs each live orch run (of any project) was given and which nvidia-smi
shows busy (``agent/queue/gpu_share.py``; the machine's GPUs are ``[targets.X] gpus = N`` where set, else
nvidia-smi's). With N free, the plan loses its ``stop_run`` and ``checkpoints`` steps, the run gets those
GPUs in ``CUDA_VISIBLE_DEVICES`` and its own checkpoint folder beside the project's (``{project}@exp{id}``,
``agent/ckpt/ckpt_layout``), and the target
starts it in a window of the project's tmux session; under the lock the target checks again that none of
its GPUs was given meanwhile. Without N free, ``--queue`` queues it (the target's queue starts it on the
GPUs the next run to end frees), else the launch is refused, naming which experiment holds which GPU.

    placed = beside(launch, n=1, queue=False)   # the Launch, placed or queued, or ConflictError
"""

from __future__ import annotations

import dataclasses

from ..errors import ConflictError, InputError
from .model import Checkpoints, Launch, StopRun


def refuse_flags(gpus: int | None, *, guard: bool = False, clean: bool = False, job: bool = False,
                 pool: str | None = None, machines: int = 1) -> None:
    """What ``--beside`` cannot be given with, before anything is asked."""
    if gpus is None:
        raise InputError("--beside places the new run on GPUs no running experiment holds, and needs to know how "
                         "many", hint="give --gpus N with --beside (orch deploy --gpus 1 --beside)")
    if guard:
        raise InputError("--guard watches a run against the one it replaces, and --beside replaces none",
                         hint="give --beside or --guard, not both")
    if clean:
        raise InputError("--beside runs next to experiments that may be writing the checkpoints; the new run gets "
                         "a checkpoint folder of its own", hint="drop --clean-checkpoints/--purge")
    if job or pool is not None or machines > 1:
        raise InputError("--beside starts one run next to the running ones on one machine",
                         hint="name one machine (--ct N or --target NAME), without --pool")


def ask(launch: Launch, n: int) -> dict:
    """The target's GPUs and who holds them (``gpu_share.share``), and the ``n`` a new run would get."""
    from ..reach.agent_client import AgentClient

    target, settings = launch.target, launch.settings
    assert target.connect is not None
    transport = target.connect()
    try:
        client = AgentClient(transport, target.root, target.python, timeout=settings.ssh.read_timeout,
                             timeout_setting="[ssh] read_timeout")
        return client.one("gpu_share", total=target.spec.gpus, n=n)
    finally:
        transport.close()


def holders(share: dict) -> str:
    """``GPU 0: experiment 1 (tinylm); GPU 1: experiment 2 (tinylm)`` (``free`` for the others)."""
    parts = []
    for row in share.get("gpus") or []:
        held = row.get("holder")
        use = f"experiment {held['id']} ({held.get('project')})" if held else row.get("busy") or "free"
        parts.append(f"GPU {row['index']}: {use}")
    return "; ".join(parts)


def refusal(share: dict, n: int, label: str) -> ConflictError:
    if share.get("error"):
        return ConflictError(f"no GPUs to run beside on {label}: {share['error']}",
                             hint="set [targets.NAME] gpus = N in orch.toml for a machine whose GPUs nvidia-smi "
                                  "does not show")
    ids = list(dict.fromkeys(r["holder"]["id"] for r in share.get("gpus") or [] if r.get("holder")))
    stop = f"orch stop -e {ids[0]}" if ids else "orch stop -e ID"
    return ConflictError(f"no {n} free GPU{'s' if n > 1 else ''} on {label} beside the running experiments: "
                         f"{holders(share)}", hint=f"queue it with --queue (it starts when GPUs free up), or free "
                                                   f"them: {stop}")


def beside(launch: Launch, n: int, queue: bool) -> Launch:
    """The launch placed next to the running experiments, queued (``queue``, none free), or refused."""
    from . import queueing

    share = ask(launch, n)
    picked = share.get("picked")
    label = launch.target.label
    spec = {"gpus": n, "total": launch.target.spec.gpus}
    if picked is None and not queue:
        raise refusal(share, n, label)
    if picked is None:
        if share.get("error"):
            raise refusal(share, n, label)
        launch.echo(f"placement: {label}: no {n} free GPU{'s' if n > 1 else ''} ({holders(share)}); queued: it "
                    "starts beside the others when GPUs free up")
        queued = queueing.queued(launch)
        queued.beside = spec
        return queued
    indices = ",".join(str(g["index"]) for g in picked)
    launch.echo(f"placement: {label}: {holders(share)}; the run gets GPU{'s' if n > 1 else ''} {indices}, beside "
                "the running experiments (none is stopped)")
    launch.env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    launch.env["CUDA_VISIBLE_DEVICES"] = indices
    launch.gpus = [{"index": g["index"], "uuid": g.get("uuid")} for g in picked]
    actions = tuple(a for a in launch.actions if not isinstance(a, (StopRun, Checkpoints)))
    return dataclasses.replace(launch, actions=actions, beside=spec)
