"""A launch on a ``kind = "slurm"`` target: the options its job is submitted with, and how its record reads.

The login node is reached like any SSH host and runs orch's agent; the run folder, revision and checkpoints are
on the shared file system under the target's root. Only the run's start differs: the agent submits a job that
runs the run's supervisor on the allocated nodes (``agent/slurm.py``), where a container's agent starts it in
tmux (``scheduler.py``: the two kinds behind one interface). So a deploy is the same plan on both: push, stop the
project's run (``scancel --signal=INT``, then ``scancel``), move checkpoints, start; and ``status``, ``logs``,
``stop`` read and act through the same agent ops.
"""

from __future__ import annotations

from ..reach.targets import Target


def job_spec(target: Target, project: str, exp_id: int | None, wanted: dict | None) -> dict:
    """sbatch's options for the run: the target's (partition, account, qos, time, sbatch_args) and the launch's
    (``--gpus``: GPUs per node, ``--nodes``)."""
    spec = target.spec
    wanted = wanted or {}
    out: dict = {"name": f"orch-{project}" + (f"-{exp_id}" if exp_id is not None else "")}
    for key in ("partition", "account", "qos", "time", "signal", "resubmit"):
        if getattr(spec, key):
            out[key] = getattr(spec, key)
    if spec.sbatch_args:
        out["sbatch_args"] = list(spec.sbatch_args)
    if wanted.get("gpus"):
        out["gpus"] = int(wanted["gpus"])
    if wanted.get("nodes"):
        out["nodes"] = int(wanted["nodes"])
    return out


PLACE = "{orch:node%d}"  # node R's address in a launcher line, which its supervisor fills in from the allocation


def launcher(settings, command: list[str] | str, exp_id: int | None, wanted: dict | None) -> dict:
    """A job over several nodes whose command runs a Python script: torchrun with a c10d rendezvous on the
    allocation's first node, as a job over containers starts (``distributed.plan``, [distributed]'s launcher,
    nproc_per_node, port and interface, [run] restarts as torchrun's). Slurm names the nodes only once the job
    runs, so each rank's line holds ``PLACE``s that its supervisor fills in (``agent/run/slurm_launch.py``),
    and that supervisor starts it only where the script's Python imports torch (else the command as it is).
    ``{}`` for one node, ``launcher = "none"``, or a command torchrun cannot be put in front of."""
    from . import distributed

    nodes = int((wanted or {}).get("nodes") or 1)
    dist = settings.distributed
    python = distributed.python_of(command)
    if nodes < 2 or distributed.launcher(dist, nodes) == "none" or (python is None and dist.launcher is None):
        return {}
    gpus = int((wanted or {}).get("gpus") or 0)
    facts = [distributed.NodeFacts(rank, f"node{rank}", PLACE % rank, None, gpus) for rank in range(nodes)]
    runs = distributed.plan(facts, command, dist, settings.project.name, exp_id, restarts=settings.run.restarts)
    env = {k: v for k, v in runs[0].env.items() if not k.startswith("ORCH_")}  # the allocation gives those
    return {"torchrun": {"argv": [run.argv for run in runs], "env": env, "places": [PLACE % r for r in range(nodes)],
                         "python": python or "python3", "port": dist.port}}


def describe(info: dict) -> str:
    """``Slurm job 42 (partition debug)`` from a row's ``target_info["slurm"]``."""
    job = info.get("slurm") or {}
    part = f", partition {job['partition']}" if job.get("partition") else ""
    return f"Slurm job {job.get('job_id')}{part}"


def state_words(status: str, job: dict | None, now: float | None = None) -> str:
    """``pending (Resources) since 12:03:14, 2 min``, ``running on ct210``, or the status itself."""
    job = job or {}
    if status == "queued":
        reason = job.get("reason")
        words = f"pending ({reason})" if reason and reason != "None" else "pending"  # None: not yet scheduled
        since = job.get("since")
        return words + (waiting(float(since), now) if isinstance(since, (int, float)) and since > 0 else "")
    if status == "running" and job.get("nodes"):
        return f"running on {job['nodes']}"
    return status


def waiting(since: float, now: float | None = None) -> str:
    """`` since 12:03:14, 2 min``: the clock time (with its date when not today) and how long that is."""
    import datetime as dt
    import time

    now = time.time() if now is None else now
    at = dt.datetime.fromtimestamp(since)
    clock = at.strftime("%H:%M:%S" if at.date() == dt.datetime.fromtimestamp(now).date() else "%Y-%m-%d %H:%M:%S")
    waited = max(0.0, now - since)  # the login node's clock may run a little ahead of this one
    if waited < 90:
        span = f"{waited:.0f} s"
    elif waited < 90 * 60:
        span = f"{waited / 60:.0f} min"
    elif waited < 48 * 3600:
        span = f"{waited / 3600:.1f} h"
    else:
        span = f"{waited / 86400:.0f} days"
    return f" since {clock}, {span}"


def pending(settings, target: Target, registry) -> list[dict]:
    """``orch queue`` on a Slurm target: the project's jobs Slurm holds back, oldest first, with its reason and
    priority (the rows reconciled in the same call)."""
    from ..reach.agent_client import Op
    from ..records.reconcile import client_for, reconcile

    client = client_for(settings, target, read_only=True)
    try:
        answer, = reconcile(settings, target, registry, client, also=[Op("status", {
            "project": settings.project.name, "tail": False, "gpus": False, "registry": registry.registry_id})])
    finally:
        client.transport.close()
    runs = [r for r in answer["runs"] if r.get("state") == "queued" and r.get("slurm") and registry.owns(r)]
    return [{"position": i + 1, "id": r["id"], "job_id": r["slurm"].get("job_id"), "reason": r["slurm"].get("reason"),
             "priority": r["slurm"].get("priority"), "since": r["slurm"].get("since"),
             "partition": r["slurm"].get("partition")} for i, r in enumerate(runs)]


def nodes(settings, target: Target) -> list[dict]:
    """``orch gpus`` on a Slurm target: each node's GPUs, in use, state, and the jobs running there."""
    from ..records.reconcile import client_for

    client = client_for(settings, target, read_only=True)
    try:
        return client.one("slurm_nodes")["nodes"]
    finally:
        client.transport.close()
