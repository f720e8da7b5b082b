"""What runs where: ask the agent, reconcile the registry with what the target says.

A run reported by a target is matched to a row only when its key is this registry's (run folders are
``runs/<registry id>-<n>``; plain ``runs/<n>`` ones from before the keys match the registry's older rows)
and the row's machine (or, for old rows, its target name) and project are the target's: another clone's
run 7 is not ours. Every command that reaches a target calls ``reconcile`` first: one agent call brings every
row of this registry on that machine and project that is not final yet (no window of recent runs) up to date
with the target: its state, exit code or signal, real end time and how it ended (``end_reason``), and settles
launches whose orch process died (``launch_guard``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from . import end_reason, guard_records
from . import launch_journal
from ..reach.agent_client import AgentClient, Op
from ..config import Settings
from ..errors import ConflictError, CtNotRunning, NotFoundError, OrchError, WrongMachine
from .experiments import FINAL, Experiment, Registry
from ..reach.targets import Target

INTERRUPTED = "launch interrupted: orch stopped before the run was started on the target"


def client_for(settings: Settings, target: Target, read_only: bool = False, transport=None) -> AgentClient:
    """An agent client (on ``transport`` when one is open already); ``read_only`` calls are bounded by
    ``[ssh] read_timeout`` (a frozen target fails fast)."""
    if transport is None:
        assert target.connect is not None
        transport = target.connect()
    if read_only:
        return AgentClient(transport, target.root, target.python, timeout=settings.ssh.read_timeout,
                           timeout_setting="[ssh] read_timeout")
    return AgentClient(transport, target.root, target.python, timeout=settings.ssh.command_timeout)


def belongs(exp: Experiment, target: Target, project: str) -> bool:
    """Whether a run the target reports under ``exp.id`` can be ``exp``: same machine, same project."""
    same_place = exp.machine == target.machine if exp.machine else exp.target == target.name
    return same_place and exp.project == project


def is_job(exp: Experiment) -> bool:
    """A job's row: settled from every node at once (``multinode``), never from one node's answer."""
    return bool(exp.nodes) or bool((exp.target_info or {}).get("members"))


def sync(registry: Registry, runs: list[dict], target: Target, project: str) -> None:
    """Record what the target reports: runs that ended on their own, crashed, or were stopped."""
    for run in runs:
        if not registry.owns(run) or run.get("project") not in (None, project):
            continue  # another clone's run (its registry key differs), or another project's
        try:
            exp = registry.get(int(run["id"]))
        except NotFoundError:
            continue
        if not belongs(exp, target, project) or registry.orphaned(exp) or is_job(exp):
            continue  # another machine's or project's run 7; an orphaned launch is settled by recover(); a job
        state = run["state"]
        if state == "launching" and exp.status == "queued":
            state = "running"  # its queue started it a moment ago: no orch process launches it
        elif state == "launching":
            continue  # a start whose supervisor is not up yet: it runs, or the target says crashed within 30 s;
            # never recorded, so no row goes back to launching with no orch process launching it
        settled = exp.status in FINAL and exp.status not in ("failed", "lost")  # lost: may resume after boot
        if run.get("slurm") and state in ("queued", "running") and exp.status in ("crashed", "finished"):
            # its Slurm job was requeued after an attempt that was killed (crashed) or that its time limit's signal
            # ended cleanly before the requeue (finished, if a status came between its exit record and the requeue)
            settled = False
        if run.get("attempts") and run["attempts"] != exp.attempts and not (settled and state not in FINAL):
            exp = registry.update(exp.id, attempts=run["attempts"])
        same = state == exp.status and (state not in FINAL or run.get("exit_code") == exp.exit_code)
        if same or (settled and state not in FINAL):
            continue
        fields: dict = {"status": state}
        if state in FINAL:
            fields.update(ended_fields(run, registry.registry_id))
        if run.get("started") and not exp.started:
            fields["started"] = run["started"]
        if exp.status == "queued" and run.get("gpus") and not exp.gpus:
            fields["gpus"] = run["gpus"]  # queued beside the others: its queue gave it the GPUs freed
        if (exp.status in ("lost", "crashed") or (run.get("slurm") and exp.status == "finished")) \
                and state not in FINAL:
            fields.update(ended=None, exit_code=None, end_reason=None)  # resumed after a reboot, or requeued
        if exp.status == "failed" and state != "failed":
            fields["error"] = None  # the launch did reach the target after all
        registry.update(exp.id, **fields)


def ended_fields(run: dict, registry_id: str | None, now: float | None = None) -> dict:
    """exit code, end time and how it ended; an end time the target does not know is None, never the check's."""
    now = time.time() if now is None else now
    reason = end_reason.describe(run, registry_id, now)
    ended = run.get("ended")  # a lost run's is known only when its supervisor saw the shutdown
    if ended is None and run.get("state") != "lost":
        reason = (f"{reason}; " if reason else "") + f"end time unknown, noticed at {end_reason.noticed(now)}"
    return {"exit_code": run.get("exit_code"), "ended": ended, "end_reason": reason}


def reconcile(settings: Settings, target: Target, registry: Registry, client: AgentClient | None = None,
              also: list[Op] | tuple = ()) -> list:
    """Bring every non-final row of this registry on the target's machine and project up to date, in one
    agent call together with the ops ``also`` (whose values are returned).

    Orphaned launches need the target's lock (an agent the dead orch left behind finishes its step first);
    if another operation holds it, they wait for the next command and the rest is read without it.
    """
    asked = ask(settings, target, registry, also)
    if not asked.ops:
        return []
    own = client is None
    client = client or client_for(settings, target)
    try:
        values = call(settings, client, asked)
    finally:
        if own:
            client.transport.close()
    return answered(settings, target, registry, asked, values)


@dataclass
class Asked:
    """What ``reconcile`` asks a target in its one call (``ops``), and what its answer settles."""

    rows: list[Experiment]  # the unsettled rows the first op asks about (none: no such op)
    lost: list[Experiment]  # orphaned launches among them: the call takes the target's lock
    journals: bool  # a journal_read of them follows
    ops: list[Op]


def ask(settings: Settings, target: Target, registry: Registry, also: list[Op] | tuple = ()) -> Asked:
    """The ops of one ``reconcile`` call (the registry is only read): the state of every unsettled row of this
    registry on the target, the journals of orphaned launches, then ``also``."""
    project = settings.project.name
    rows = [e for e in registry.unsettled(target.machine, target.name, project) if not is_job(e)]
    ops = [Op("status", {"project": project, "ids": [e.id for e in rows], "tail": False, "gpus": False,
                         "registry": registry.registry_id})] if rows else []
    lost = [e for e in rows if registry.orphaned(e)]
    journals = [Op("journal_read", {"ids": [e.id for e in lost], "registry": registry.registry_id})] if lost else []
    return Asked(rows, lost, bool(journals), ops + journals + list(also))


def call(settings: Settings, client: AgentClient, asked: Asked) -> list:
    """The one agent call of ``asked``: with the target's lock when it settles orphaned launches (held by another
    operation: without it, and they wait for the next command)."""
    try:
        return client.call(asked.ops, lock=settings.run.lock_timeout if asked.lost else None, what="check the runs")
    except ConflictError:
        if not asked.lost:
            raise
        asked.lost = []
        return client.call(asked.ops, what="check the runs")


def answered(settings: Settings, target: Target, registry: Registry, asked: Asked, values: list) -> list:
    """Record what the target answered ``asked``; the values of its ``also`` ops."""
    values = list(values)
    project = settings.project.name
    if asked.rows:
        runs = values.pop(0)["runs"]
        found = values.pop(0) if asked.journals else {}
        told = {e.id: launch_journal.facts(found.get(str(e.id), [])) for e in asked.lost}
        _settle(registry, asked.lost, runs, project, told)
        sync(registry, runs, target, project)
        guard_records.record(registry, runs, target.machine)
        _stopped_by_journal(registry, told, target, project)
    return values


def _settle(registry: Registry, lost: list[Experiment], runs: list[dict], project: str, told: dict) -> None:
    """Orphaned launches: failed if the target never started them, else their real state; where their
    checkpoints went, from their journal."""
    found = {r["id"]: r for r in runs if r.get("project") in (None, project) and registry.owns(r)}
    now = time.time()
    for exp in lost:
        run = found.get(exp.id)
        facts = told.get(exp.id) or launch_journal.facts([])
        if run is None:
            fields: dict = {"status": "failed", "ended": now, "error": launch_journal.not_started(facts, INTERRUPTED)}
        else:
            state = "running" if run["state"] == "launching" else run["state"]
            fields = {"status": state, "started": run.get("started") or now}
            if state in FINAL:
                fields.update(ended_fields(run, registry.registry_id, now))
            if state == "failed" and launch_journal.where_checkpoints(facts):
                fields["end_reason"] = (fields.get("end_reason") or "not started") + \
                    launch_journal.where_checkpoints(facts)
        fields.update(launch_journal.checkpoint_fields(facts))
        registry.settle(exp.id, **fields)


def _stopped_by_journal(registry: Registry, told: dict, target: Target, project: str) -> None:
    """The runs an orphaned launch stopped, as its journal says: who stopped them, their exit codes."""
    for exp_id, facts in told.items():
        for run in facts["stopped"]:
            if not registry.owns(run) or run.get("state") not in FINAL:
                continue
            try:
                old = registry.get(int(run["id"]))
            except NotFoundError:
                continue
            if belongs(old, target, project):
                registry.update(old.id, status=run["state"], exit_code=run.get("exit_code"),
                                ended=run.get("ended") or old.ended,
                                end_reason=launch_journal.stopped_reason(exp_id, facts))


def recover(settings: Settings, target: Target, registry: Registry, client: AgentClient | None = None) -> None:
    """``reconcile`` alone, for a command about to reach the target."""
    reconcile(settings, target, registry, client)


def reconcile_quietly(settings: Settings, target: Target, registry: Registry, client: AgentClient) -> str | None:
    """``reconcile`` for commands whose own work must not depend on it (exec, attach): the error, or None. Another
    machine answering for the CT is never passed over: the command must not go there either."""
    try:
        reconcile(settings, target, registry, client)
    except (WrongMachine, CtNotRunning):
        raise
    except OrchError as exc:
        return exc.message
    return None


def status_asked(settings: Settings, target: Target, registry: Registry, experiment: int | None = None,
                 also: list[Op] | tuple = ()) -> Asked:
    """The one call of a status of the target: ``reconcile``'s ops, the latest runs (``experiment`` among them when
    given), then ``also``."""
    latest20 = Op("status", {"project": settings.project.name, "last": 20, "registry": registry.registry_id}
                  | ({"ids": [experiment]} if experiment is not None else {}))
    return ask(settings, target, registry, also=[latest20, *also])


def status_answered(settings: Settings, target: Target, registry: Registry, asked: Asked, values: list,
                    experiment: int | None = None) -> tuple[dict, list]:
    """The latest experiment on the target (or ``experiment``) with its live state and the tail of its log, and
    every live run of the project there (``live``: runs side by side, newest first), from the values of
    ``status_asked``'s call; and the values of its ``also``."""
    from . import side_by_side

    answer, *rest = answered(settings, target, registry, asked, values)
    sync(registry, answer["runs"], target, settings.project.name)
    guard_records.record(registry, answer["runs"], target.machine)
    sync(registry, answer["runs"], target, settings.project.name)  # a restored run just recorded
    slurm = target.spec.kind == "slurm"  # a job pending for its nodes is what the cluster runs next
    latest: Experiment | None = registry.latest(target.machine, target.name, queued=slurm) if experiment is None \
        else registry.get(experiment)
    run = None
    if latest is not None:
        run = next((r for r in answer["runs"] if r.get("id") == latest.id and registry.owns(r)), None)
    return {"target": target.name, "label": target.label, "info": target.info, "now": answer["now"],
            "experiment": latest, "run": run, "runs": answer["runs"], "gpus": answer.get("gpus", []),
            "live": side_by_side.live(registry, target, settings.project.name),
            "queue": answer.get("queue", [])}, rest
