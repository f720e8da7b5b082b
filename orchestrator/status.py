"""What runs where: ask the agent, reconcile the registry with what the target says.

A run reported by a target is matched to a row only when its key is this registry's (run folders are
``runs/<registry id>-<n>``; plain ``runs/<n>`` ones from before the keys match the registry's older rows)
and the row's machine (or, for old rows, its target name) and project are the target's: another clone's
run 7 is not ours. ``recover`` settles launches whose orch process died (``launch_guard``) the next time a command
reaches their target.
"""

from __future__ import annotations

import time

from .agent_client import AgentClient, Op
from .config import Settings
from .errors import ConflictError, NotFoundError
from .experiments import FINAL, Experiment, Registry
from .targets import Target

INTERRUPTED = "launch interrupted: orch stopped before the run was started on the target"


def client_for(settings: Settings, target: Target) -> AgentClient:
    assert target.connect is not None
    return AgentClient(target.connect(), target.root, target.python, timeout=settings.ssh.command_timeout)


def belongs(exp: Experiment, target: Target, project: str) -> bool:
    """Whether a run the target reports under ``exp.id`` can be ``exp``: same machine, same project."""
    same_place = exp.machine == target.machine if exp.machine else exp.target == target.name
    return same_place and exp.project == project


def sync(registry: Registry, runs: list[dict], target: Target, project: str) -> None:
    """Record what the target reports: runs that ended on their own, crashed, or were stopped."""
    for run in runs:
        if not registry.owns(run) or run.get("project") not in (None, project):
            continue  # another clone's run (its registry key differs), or another project's
        try:
            exp = registry.get(int(run["id"]))
        except NotFoundError:
            continue
        if not belongs(exp, target, project) or registry.orphaned(exp):
            continue  # another machine's or project's run 7; an orphaned launch is settled by recover()
        state = run["state"]
        settled = exp.status in FINAL and exp.status not in ("failed", "lost")  # lost: may resume after boot
        if run.get("attempts") and run["attempts"] != exp.attempts and not (settled and state not in FINAL):
            exp = registry.update(exp.id, attempts=run["attempts"])
        same = state == exp.status and (state not in FINAL or run.get("exit_code") == exp.exit_code)
        if same or (settled and state not in FINAL):
            continue
        fields: dict = {"status": state}
        if state in FINAL:
            fields.update(exit_code=run.get("exit_code"), ended=run.get("ended") or time.time())
        if run.get("started") and not exp.started:
            fields["started"] = run["started"]
        if exp.status == "lost" and state not in FINAL:
            fields.update(ended=None, exit_code=None)  # resumed after a reboot
        if exp.status == "failed" and state != "failed":
            fields["error"] = None  # the launch did reach the target after all
        registry.update(exp.id, **fields)


def recover(settings: Settings, target: Target, registry: Registry, client: AgentClient | None = None) -> list:
    """Settle this target's orphaned launches: failed if the target never started them, else their real state.

    Costs nothing when there are none. The target's lock is taken, so an agent the dead orch left behind
    has finished its step first; if another operation holds the lock, they wait for the next command.
    """
    project = settings.project.name
    lost = registry.orphans(target.machine, target.name, project)
    if not lost:
        return []
    own = client is None
    client = client or client_for(settings, target)
    try:
        op = Op("status", {"project": project, "ids": [e.id for e in lost], "tail": False, "gpus": False})
        runs = client.call([op], lock=settings.run.lock_timeout, what="check interrupted launches")[0]["runs"]
    except ConflictError:
        return []
    finally:
        if own:
            client.transport.close()
    found = {r["id"]: r for r in runs if r.get("project") == project and registry.owns(r)}
    now = time.time()
    settled = []
    for exp in lost:
        run = found.get(exp.id)
        if run is None:
            fields: dict = {"status": "failed", "ended": now, "error": INTERRUPTED}
        else:
            state = "running" if run["state"] == "launching" else run["state"]
            fields = {"status": state, "started": run.get("started") or now}
            if state in FINAL:
                fields.update(exit_code=run.get("exit_code"), ended=run.get("ended") or now)
        settled.append(registry.settle(exp.id, **fields))
    return settled


def target_status(settings: Settings, target: Target, registry: Registry, client: AgentClient) -> dict:
    """The latest experiment on the target with its live state and the tail of its log."""
    recover(settings, target, registry, client)
    answer = client.one("status", project=settings.project.name, last=20, registry=registry.registry_id)
    sync(registry, answer["runs"], target, settings.project.name)
    latest: Experiment | None = registry.latest(target.machine, target.name)
    run = None
    if latest is not None:
        run = next((r for r in answer["runs"] if r.get("id") == latest.id and registry.owns(r)), None)
    return {"target": target.name, "label": target.label, "info": target.info, "now": answer["now"],
            "experiment": latest, "run": run, "runs": answer["runs"], "gpus": answer.get("gpus", [])}
