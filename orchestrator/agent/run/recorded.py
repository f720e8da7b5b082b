"""What a run's supervisor records of its attempts (``attempts.json``, written by ``attempts.py``) and what a job
node's watchdog heard from its peers (``job.json``, ``heartbeat.py``), as ``status`` reads them: apart from the
modules that write them, so that a status call imports none of the supervisor's modules."""

from __future__ import annotations

import os

from ..layout import read_json

ATTEMPTS = "attempts.json"
JOB_STATE = "job.json"


def attempts(run_dir: str) -> dict:
    """What ``status`` reports about a run's attempts (empty for a run that never restarted and has no policy)."""
    data = read_json(os.path.join(run_dir, ATTEMPTS), {}) or {}
    items = data.get("attempts") or []
    if not items:
        return {}
    failed = [a for a in items if a.get("reason") not in (None, "exit code 0")]
    return {"attempt": len(items), "max_attempts": data.get("max"), "attempts": items,
            "waiting_until": data.get("waiting_until"),
            "last_reason": failed[-1]["reason"] if failed else None,
            "resumed_from": items[-1].get("resumed_from")}


def job_state(run_dir: str) -> dict | None:
    """A node of a job: what its stall watchdog heard from its peers (its ``job.json``)."""
    got = read_json(os.path.join(run_dir, JOB_STATE))
    return got if isinstance(got, dict) else None
