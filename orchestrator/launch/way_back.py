"""After a launch failed past its point of no return: put the moved checkpoints back, and say what happened.

The locked apply (``operations._apply``) checks everything that can make the start fail before it stops
the old run (``run_check``). What is left (the container killed during the start, tmux dying under it)
fails after the old run was stopped and its checkpoints moved into a trash entry. Then::

    note = way_back.after_failed_start(launch, client, registry, exp, done, failed_op)

puts the entry back (``checkpoints.put_back``, which never overwrites), records each stopped run as
stopped by this experiment, and returns the sentence to add to the error: what was stopped, and where the
checkpoints are now (with the ``orch checkpoints restore`` command when they could not be put back), and the
command that starts the stopped run again (``result.go_back``: ``orch restart -e 9``).
"""

from __future__ import annotations

import time
from typing import Any

from .. import checkpoints
from ..reach.agent_client import AgentClient
from ..records.end_reason import stopped_by
from .result import go_back, update_quietly
from ..records.experiments import Experiment, Registry
from .model import Launch

START_OPS = ("start", "verify")


def record_stopped(launch: Launch, registry: Registry, stop: dict | None, by: int | None, why: str = "") -> list:
    """Record the runs a ``run_stop`` stopped (this registry's only), with who stopped them; returns them."""
    runs = (stop or {}).get("stopped") or []
    for run in runs:
        run["mine"] = registry.owns(run)
        update_quietly(registry, run, launch, status=run["state"], exit_code=run["exit_code"],
                       ended=run.get("ended") or time.time(), end_reason=stopped_by({"experiment": by}, why=why))
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
    fields = checkpoints.record(trash)
    if failed in START_OPS and trash.get("entry"):
        back = checkpoints.put_back(launch.target, launch.settings, trash["entry"], trash["entry_path"],
                                    what="put the checkpoints back after a failed start", client=client,
                                    moved=trash.get("moved", 0), action=trash["action"])
        fields.update(back.fields)
        parts.append(back.said)
    if failed in START_OPS and (again := go_back(stopped, started=False)):
        parts.append(again)
    return "; ".join(parts), fields
