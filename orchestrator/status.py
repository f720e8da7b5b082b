"""What runs where: ask the agent, reconcile the registry with what the target says."""

from __future__ import annotations

import time

from .agent_client import AgentClient
from .config import Settings
from .errors import NotFoundError
from .experiments import FINAL, Experiment, Registry
from .targets import Target


def client_for(settings: Settings, target: Target) -> AgentClient:
    assert target.connect is not None
    return AgentClient(target.connect(), target.root, target.python, timeout=settings.ssh.command_timeout)


def sync(registry: Registry, runs: list[dict]) -> None:
    """Record what the target reports: runs that ended on their own, crashed, or were stopped."""
    for run in runs:
        if run.get("id") is None:
            continue
        try:
            exp = registry.get(int(run["id"]))
        except NotFoundError:
            continue
        state = run["state"]
        same = state == exp.status and (state not in FINAL or run.get("exit_code") == exp.exit_code)
        if same or (exp.status in FINAL and exp.status != "failed" and state not in FINAL):
            continue
        fields: dict = {"status": state}
        if state in FINAL:
            fields.update(exit_code=run.get("exit_code"), ended=run.get("ended") or time.time())
        if run.get("started") and not exp.started:
            fields["started"] = run["started"]
        if exp.status == "failed" and state != "failed":
            fields["error"] = None  # the launch did reach the target after all
        registry.update(exp.id, **fields)


def target_status(settings: Settings, target: Target, registry: Registry, client: AgentClient) -> dict:
    """The latest experiment on the target with its live state and the tail of its log."""
    answer = client.one("status", project=settings.project.name, last=20)
    sync(registry, answer["runs"])
    latest: Experiment | None = registry.latest(target.machine, target.name)
    run = None
    if latest is not None:
        run = next((r for r in answer["runs"] if r.get("id") == latest.id), None)
    return {"target": target.name, "label": target.label, "info": target.info, "now": answer["now"],
            "experiment": latest, "run": run, "runs": answer["runs"], "gpus": answer.get("gpus", [])}
