"""``orch deploy --queue``: the deploy plan turned into one that queues its start on the target.

The revision is pushed and assembled now (so it cannot change afterwards) and the experiment is recorded
``queued``; what the running experiment's end changes (stopping it, moving its checkpoints, verifying a start)
is left out: the target's queue (``agent/queue/runqueue.py``) starts the run when the one before it ends.

    queued(launch) -> the same Launch whose plan has a QueueRun where it had StartRun
"""

from __future__ import annotations

import dataclasses

from ..errors import InputError, OrchError
from ..reach.agent_client import Op
from .model import Checkpoints, Launch, QueueRun, Shell, StartRun, StopRun, VerifyStarted


def queued(launch: Launch, start_idle: bool = True) -> Launch:
    """Refuse what a queued start cannot carry; else the plan without the steps that belong to its start."""
    if launch.secrets:
        raise InputError(f"a queued experiment cannot receive secrets ({', '.join(sorted(launch.secrets))}): "
                         "they are never stored on the target, and it starts with no controller connected",
                         hint="deploy it without --queue, or drop [project] secrets for these runs")
    if launch.inputs.checkpoint_action != "keep":
        raise InputError("--queue cannot clean the checkpoints: the run before it may still be writing them",
                         hint="clean them when the queue is done (orch checkpoints clean), or drop the flag")
    if any(isinstance(a, Shell) and a.cwd == "work" for a in launch.actions):
        raise InputError("the playbook has a shell step in the run's work folder, which a queued start "
                         "cannot run", hint="deploy without --queue, or move the step out of the run's folder")
    if not any(isinstance(a, StartRun) for a in launch.actions):
        raise InputError(f"the playbook {launch.book.name} starts nothing: there is nothing to queue",
                         hint="orch deploy --queue uses the deploy playbook")
    actions = []
    for action in launch.actions:
        if isinstance(action, (StopRun, Checkpoints, VerifyStarted)):
            continue
        if isinstance(action, StartRun):
            fields = {f.name: getattr(action, f.name) for f in dataclasses.fields(action)}
            action = QueueRun(**fields, start_idle=start_idle)
        actions.append(action)
    return dataclasses.replace(launch, actions=tuple(actions))


def listing(settings, target, registry) -> list[dict]:
    """The target's queue of this project, in order (a queue nothing would start is started first: a reboot
    where systemd is not running), each entry with its row's message and sweep; its rows brought up to date."""
    from ..records.reconcile import client_for, reconcile

    client = client_for(settings, target)
    try:
        found = reconcile(settings, target, registry, client,
                          also=[Op("queue_list", {"project": settings.project.name})])[0]
        if found.get("started") is not None:  # what it started is recorded now, not at the next command
            reconcile(settings, target, registry, client)
    finally:
        client.transport.close()
    return [_with_row(entry, registry) for entry in found["queue"]]


def _with_row(entry: dict, registry) -> dict:
    from ..errors import NotFoundError

    entry = dict(entry, mine=registry.owns(entry))
    if entry["mine"]:
        try:
            exp = registry.get(int(entry["id"]))
            entry.update(message=exp.message, status=exp.status, sweep=exp.sweep or entry.get("sweep"))
        except NotFoundError:
            pass
    return entry


def remove(settings, target, registry, ids: list[int] | None = None, sweep: str | None = None) -> list[int]:
    """Take experiments out of the target's queue (``ids``, those of ``sweep``, or all of this registry's);
    their rows read ``stopped``, removed from the queue before they started. Returns the ids removed."""
    import time

    from ..records.reconcile import client_for, reconcile

    client = client_for(settings, target)
    try:
        reconcile(settings, target, registry, client)
        args = {"project": settings.project.name, "ids": ids, "registry": registry.registry_id, "sweep": sweep}
        removed = client.call([Op("queue_remove", args)], lock=settings.run.lock_timeout,
                              what="remove from the queue")[0]["removed"]
    finally:
        client.transport.close()
    now = time.time()
    for exp_id in removed:
        try:
            exp = registry.get(int(exp_id))
        except OrchError:
            continue
        if exp.status == "queued":
            registry.update(exp.id, status="stopped", ended=now, end_reason="removed from the queue before it started")
    return removed
