"""How a run ended, in words for the registry and ``status``, from what the target reports (pure).

    describe({"state": "crashed", "exit_code": 129, "signal": 1, "cause": "the tmux server went away"})
        -> "SIGHUP: the tmux server went away"
    describe({"state": "stopped", "stopped_by": {"experiment": 7, "registry": "ab12…"}}, registry_id="ab12…")
        -> "stopped by experiment 7"
    describe({"state": "lost", "cause": "the container stopped"}, now=t)
        -> "the container stopped; end time unknown, noticed at 2026-11-30 15:20:11"
    describe({"state": "finished", "budget": {...}, "cause": "reached its budget of 200 steps"})
        -> "reached its budget of 200 steps"
    describe({"state": "lost", "cause": "interrupted by the container's shutdown", "ended": t})
        -> "interrupted by the container's shutdown"  (not crashed: it resumes after boot, see resume_after_reboot)
"""

from __future__ import annotations

import signal
import time


def signal_name(sig: object) -> str | None:
    """``SIGHUP`` for 1; ``signal 99`` for a number no signal has; None for none."""
    try:
        return signal.Signals(int(sig)).name if sig else None  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return f"signal {sig}"


def stopped_by(by: dict | None, registry_id: str | None = None, why: str = "") -> str | None:
    """``stopped by experiment 7``; ``… of another clone of this project (host, path)``; ``by orch stop``;
    ``by the conductor of sweep s4be1f0`` (a search conducted on its target).

    ``by`` is what the target recorded (``{"experiment": 7, "registry": "ab12…", "clone": {…}}``), or what
    this clone knows itself (``{"experiment": 7}``); ``why`` is added after the experiment.
    """
    if not isinstance(by, dict):
        return None
    if by.get("sweep"):  # a search's conductor on the target: a pruned trial, or the sweep's end
        return f"stopped by the conductor of sweep {by['sweep']}"
    exp = by.get("experiment")
    mine = by.get("registry") == registry_id
    clone = by.get("clone") or {}
    other = f" of another clone of this project ({clone.get('host', '?')}, {clone.get('path', '?')})" \
        if not mine else ""
    if exp is None:
        return "stopped by orch stop" + (f" from another clone ({clone.get('host', '?')}, {clone.get('path', '?')})"
                                          if not mine else "")
    return f"stopped by experiment {exp}{other}{why}"


def noticed(now: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))


def guard_reason(guard: dict | None) -> str | None:
    """A guarded run's end as its guard decided it (``agent/watch/guard.py``); None while it watches or once it held.

        guard_reason({"state": "rolled back", "reason": "throughput 11.9 Ktok/s < 0.9 × 32.0 Ktok/s of exp 12 …"})
            -> "rolled back: throughput 11.9 Ktok/s < 0.9 × 32.0 Ktok/s of exp 12 …"
    """
    if not isinstance(guard, dict) or not guard.get("reason"):
        return None
    state, reason = guard.get("state"), guard["reason"]
    if state == "rollback failed":
        return f"guard failed: {reason}; the rollback failed: {guard.get('error') or '?'}"
    if guard.get("on_fail") == "stop":
        return f"guard failed: {reason}; stopped ([guard] on_fail = \"stop\")"
    if state in ("failed", "rolled back"):
        return f"rolled back: {reason}"
    return None


def restored(parent: object, failed: object) -> str:
    return f"restored from exp {parent} after the guard of exp {failed} failed"


def describe(run: dict, registry_id: str | None = None, now: float | None = None) -> str | None:
    """The end of a run in a few words, or None for a run that is not over or finished cleanly."""
    state = run.get("state")
    if state in ("stopped", "crashed", "finished", "lost") and guard_reason(run.get("guard")):  # lost: in its window
        return guard_reason(run.get("guard"))
    if state == "stopped":
        return stopped_by(run.get("stopped_by"), registry_id)
    if state == "failed":
        return f"not started: {run['error']}" if run.get("error") else None
    if state == "lost":
        cause = run.get("cause") or "its supervisor vanished"
        if run.get("ended"):  # its supervisor saw it go: "interrupted by the container's shutdown"
            return cause
        return f"{cause}; end time unknown, noticed at {noticed(now or time.time())}"
    if state == "crashed":
        name = signal_name(run.get("signal"))
        if name:
            return f"{name}: {run['cause']}" if run.get("cause") else name
        if run.get("exit_code") is None:
            return run.get("cause") or "no exit code recorded"  # a Slurm job that ended without its supervisor's
        return f"exit code {run['exit_code']}"
    if state == "finished" and run.get("budget"):  # ended by its supervisor at ORCH_MAX_STEPS / ORCH_MAX_MINUTES
        return run.get("cause") or "reached its budget"
    return None
