"""``deploy --guard`` / ``restart --guard``: what the controller decides before the target watches alone.

The guard itself runs on the target (``agent/watch/guard.py``, in the new run's supervisor; ``agent/run/rollback.py``
for the way back). Here: refuse a guard that could not keep its promise, before anything changes, and write
the spec the supervisor gets: ``[guard]``, the parent's run key (the run the launch stops) and the number kept
in the registry (``Registry.reserve``) for the run a rollback would start, recorded by the next command that
hears of it (``records/guard_records.py``).
"""

from __future__ import annotations

from ..errors import InputError
from ..records.experiments import Experiment, Registry
from .model import Launch


def check(launch: Launch, probe: dict, registry: Registry) -> dict:
    """The run the guarded launch replaces (its status from the probe); refusals say what to do instead."""
    label = launch.target.label
    if launch.inputs.checkpoint_action == "purge":
        raise InputError("--guard puts the parent's checkpoints back after a failed guard, and --purge deletes them",
                         hint="use --guard alone: it moves them to the trash, where they stay if the guard passes")
    if launch.settings.guard.on_fail == "rollback" and launch.secrets:
        raise InputError("a rollback restarts the parent on the target by itself, and [project] secrets are never "
                         "stored there", hint="set [guard] on_fail = \"stop\", or deploy without --guard")
    alive = probe.get("alive_runs") or []
    if not alive:
        raise InputError(f"--guard compares the new run with the one it replaces, and no run of this project is up "
                         f"on {label}", hint="deploy without --guard (there is nothing to roll back to)")
    if len(alive) > 1:
        ids = ", ".join(str(r["id"]) for r in alive)
        raise InputError(f"--guard watches one run against one parent, and {len(alive)} runs of this project are up "
                         f"on {label} (experiments {ids})",
                         hint="stop the ones side by side first (orch stop -e ID), or orch deploy without --guard")
    if alive[0].get("job"):
        raise InputError(f"--guard watches one run against one parent; experiment {alive[0]['id']} on {label} is "
                         "a node of a job", hint="deploy without --guard")
    if not registry.owns(alive[0]):
        raise InputError(f"--guard would put back experiment {alive[0]['id']} on {label}, which another clone of "
                         "this project started, and only that clone's registry can record it",
                         hint="deploy --guard from that clone, or deploy without --guard")
    return alive[0]


def spec(launch: Launch, registry: Registry, exp: Experiment, parent: dict) -> dict:
    """The guard spec for the new run's supervisor; keeps the number of the run a rollback would start."""
    out = launch.settings.guard.spec()
    out["parent"] = {"id": parent["id"], "registry": parent.get("registry")}
    if out["on_fail"] == "rollback":
        out["restore"] = {"id": registry.reserve(), "registry": registry.run_registry(exp.id)}
    return out


VERDICTS = ("passed", "rolled back", "rollback failed", "stopped on failure", "stopped")
POLL_S = 0.25


def wait_verdict(launch: Launch, client, registry: Registry, exp: Experiment) -> dict:
    """``--wait`` of a guarded launch: until the guard holds, or its rollback is over, or ``launch.wait`` s;
    then both rows recorded as the target says (``records.guard_records``)."""
    import time

    from ..reach.agent_client import Op
    from ..records.reconcile import reconcile

    key = registry.run_registry(exp.id)
    begin = time.monotonic()
    guard: dict = {}
    while True:
        op = Op("status", {"project": launch.settings.project.name, "ids": [exp.id], "tail": False, "gpus": False,
                           "registry": key})
        runs = client.call([op], what="watch the guard")[0]["runs"]
        run = next((r for r in runs if r.get("id") == exp.id and registry.owns(r)), {})
        guard = run.get("guard") or {}
        if guard.get("state") in VERDICTS or not guard:
            break
        if time.monotonic() - begin >= launch.wait:
            break
        time.sleep(POLL_S)
    reconcile(launch.settings, launch.target, registry, client)
    from ..records import guard_records

    guard_records.record(registry, [run] if run else [], launch.target.machine)
    return {**guard, "seconds": round(time.monotonic() - begin, 1)}
