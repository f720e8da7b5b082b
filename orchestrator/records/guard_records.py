"""A guarded run's outcome, recorded from what its target reports (the target cannot write the registry).

A rollback starts the parent again under the number the launch kept (``Registry.reserve``); the first command
of any clone sharing this registry that hears of it records that run as a new experiment, copied from the
parent's row (its revision and settings) with ``restored from exp 12 after the guard of exp 13 failed``, and the
failed run's end as the guard said: ``rolled back: throughput 11.9 Ktok/s < 0.9 × 32.0 Ktok/s of exp 12 over
steps 20–200``.
"""

from __future__ import annotations

from . import end_reason
from ..errors import NotFoundError
from .experiments import FINAL, Experiment, Registry

COPIED = ("project", "target", "target_info", "machine", "revision", "revision_files", "git_commit", "git_dirty",
          "git_diff", "command", "config", "batching", "batching_plan", "checkpoints")


def record(registry: Registry, runs: list[dict], machine: str | None) -> None:
    """The guard's end reason on the failed run's row, and the restored run's row, for each reported guarded run."""
    for run in runs:
        guard = run.get("guard")
        if not isinstance(guard, dict) or not registry.owns(run):
            continue
        try:
            exp = registry.get(int(run["id"]))
        except NotFoundError:
            continue
        if exp.machine != machine:
            continue
        said = end_reason.guard_reason(guard)
        if said and exp.status in FINAL and run.get("state") in FINAL and exp.end_reason != said:
            registry.update(exp.id, end_reason=said)
        restored = guard.get("restored")
        if guard.get("state") == "rolled back" and restored is not None:
            _restored_row(registry, exp, int(restored), guard)


def _restored_row(registry: Registry, failed: Experiment, exp_id: int, guard: dict) -> None:
    try:
        registry.get(exp_id)
        return
    except NotFoundError:
        pass
    source: Experiment = failed
    parent_id = guard.get("parent")
    try:
        parent = registry.get(int(parent_id))
        if parent.machine == failed.machine:
            source = parent
    except (NotFoundError, TypeError, ValueError):
        pass  # another clone's run: the failed row says where, the target what runs
    fields = {k: getattr(source, k) for k in COPIED}
    registry.insert_reserved(exp_id, **fields, parent=parent_id, status="running",
                             started=guard.get("rolled_back_at"), checkpoints_action="kept",
                             message=end_reason.restored(parent_id, failed.id))
