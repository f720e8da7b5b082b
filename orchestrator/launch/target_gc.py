"""``orch gc`` on one target: what may go (the agent's gc as a dry run), and once confirmed, exactly that.

What stays: every live run, this project's last ``keep`` experiments' runs, revisions and envs (as the registry
knows them), checkpoints and their trash. The removal names each item the plan listed, so nothing that appeared
between the plan and the confirmation is removed.
"""

from __future__ import annotations

from typing import Callable, ContextManager

from ..config import Settings
from ..records.experiments import Registry
from ..reach.targets import Target


def kept_revisions(settings: Settings, target: Target, registry: Registry, keep: int) -> list[str]:
    """The revisions of the project's last ``keep`` experiments on this machine, as the registry knows them."""
    mine = [e for e in registry.list(machine=target.machine) if e.project == settings.project.name]
    return sorted({e.revision for e in mine[:keep] if e.revision})


def kept_envs(settings: Settings, target: Target, registry: Registry, keep: int) -> list[str]:
    """The envs (``[env]``) of the project's last ``keep`` experiments on this machine."""
    mine = [e for e in registry.list(machine=target.machine) if e.project == settings.project.name]
    return sorted({e.env["hash"] for e in mine[:keep] if e.env and e.env.get("hash")})


def collect(settings: Settings, target: Target, open_registry: Callable[[], ContextManager[Registry]], *,
            keep: int, dry_run: bool, confirm: Callable[[dict], None]) -> tuple[dict, dict | None]:
    """``(plan, result)``: the plan alone (``result`` None) for a dry run or when nothing is to be removed; else
    ``confirm(plan)`` (which raises to refuse) and then the removal of the plan's items, under the target's lock.

    The registry's unsettled rows on the target are brought up to date first, so a run that ended is not kept
    as live.
    """
    from ..reach.agent_client import Op
    from ..records.reconcile import client_for, reconcile

    with open_registry() as reg:
        kept = kept_revisions(settings, target, reg, keep)
        envs = kept_envs(settings, target, reg, keep)
    args = {"project": settings.project.name, "keep": keep, "checkpoints": [target.checkpoints],
            "keep_revisions": kept, "keep_envs": envs}
    client = client_for(settings, target)
    try:
        with open_registry() as reg:
            reconcile(settings, target, reg, client)
        lock = settings.run.lock_timeout
        plan = client.call([Op("gc", {**args, "dry_run": True})], lock=lock, what="gc (plan)")[0]
        if dry_run or not plan["items"]:
            return plan, None
        confirm(plan)
        only = [f"{i['kind']}:{i['name']}" for i in plan["items"]]
        return plan, client.call([Op("gc", {**args, "dry_run": False, "only": only})], lock=lock, what="gc")[0]
    finally:
        client.transport.close()
