"""After a launch failed past its point of no return: put the moved checkpoints back, and say what happened.

The locked apply (``operations._apply``) checks everything that can make the start fail before it stops
the old run (``run_check``). What is left (the container killed during the start, tmux dying under it)
fails after the old run was stopped and its checkpoints moved into a trash entry. Then::

    note = way_back.after_failed_start(launch, client, registry, exp, done, failed_op)

puts the entry back with ``ckpt_restore`` (which never overwrites), records each stopped run as stopped
by this experiment, and returns the sentence to add to the error: what was stopped, and where the
checkpoints are now (with the ``orch checkpoints restore`` command when they could not be put back).
"""

from __future__ import annotations

import time
from typing import Any

from ..reach.agent_client import AgentClient, Op
from .result import update_quietly
from ..errors import OrchError
from ..records.experiments import Experiment, Registry
from .model import Launch

START_OPS = ("start", "verify")


def stopped_by(exp_id: int | None, why: str = "") -> str:
    return f"stopped by experiment {exp_id}{why}" if exp_id is not None else "stopped by orch stop"


def record_stopped(launch: Launch, registry: Registry, stop: dict | None, by: int | None, why: str = "") -> list:
    """Record the runs a ``run_stop`` stopped (this registry's only), with who stopped them; returns them."""
    runs = (stop or {}).get("stopped") or []
    for run in runs:
        run["mine"] = registry.owns(run)
        update_quietly(registry, run, launch, status=run["state"], exit_code=run["exit_code"],
                       ended=run.get("ended") or time.time(), end_reason=stopped_by(by, why))
    return runs


def after_failed_start(launch: Launch, client: AgentClient, registry: Registry, exp: Experiment | None,
                       done: dict[str, Any], failed: str | None) -> tuple[str, dict]:
    """(sentence for the error, registry fields for the new experiment) once the apply failed.

    ``done`` maps the apply's keys to the values of the ops that finished; ``failed`` is the key of the op
    that failed. Nothing is undone unless the failure came after the old run was stopped or its checkpoints
    moved, at the start itself.
    """
    exp_id = exp.id if exp is not None else None
    why = " (whose start then failed)" if failed in START_OPS else ""
    stopped = record_stopped(launch, registry, done.get("stop"), exp_id, why)
    parts = []
    if stopped:
        names = ", ".join(str(r["id"]) for r in stopped)
        parts.append(f"experiment {names} was stopped by this launch")
    trash = done.get("trash") or {}
    fields: dict = {"checkpoints_action": trash.get("action"), "checkpoints_entry": trash.get("entry_path")} \
        if trash else {}
    if failed in START_OPS and trash.get("entry"):
        parts.append(_put_back(launch, client, trash, fields))
    return "; ".join(parts), fields


def _put_back(launch: Launch, client: AgentClient, trash: dict, fields: dict) -> str:
    target, settings = launch.target, launch.settings
    base = {"path": target.checkpoints, "configured": target.checkpoints}
    try:
        client.call([Op("ckpt_restore", {**base, "name": trash["entry"]})], lock=settings.run.lock_timeout,
                    what="put the checkpoints back after a failed start")
    except OrchError as exc:
        return (f"the checkpoints it moved aside are in {trash['entry_path']} on {target.label} "
                f"(putting them back failed: {exc.message}); orch checkpoints restore {trash['entry']} "
                "puts them back")
    fields.update(checkpoints_action="restored", checkpoints_entry=None)
    return f"the {trash.get('moved', 0)} checkpoint file(s) it moved aside were put back in {target.checkpoints}"
