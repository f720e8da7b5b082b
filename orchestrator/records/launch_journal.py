"""What a launch's journal on the target says it did (pure), for settling a launch orch never heard back from.

The agent writes the journal in the new run's folder, one line per step of the locked apply
(``agent/journal.py``). ``facts`` turns its entries into what the registry needs::

    facts([{"event": "done", "op": "run_stop", "value": {"stopped": [{"id": 1, ...}]}},
           {"event": "done", "op": "ckpt_trash", "value": {"action": "moved", "entry": "2026…-exp1", ...}},
           {"event": "failed", "op": "run_start", "error": {"message": "tmux …"}}])
      -> {"trash": {...}, "stopped": [{"id": 1, ...}], "started": False, "failed": {"op": "run_start", ...}, ...}
"""

from __future__ import annotations

from .end_reason import stopped_by

START_OPS = ("run_start", "run_verify")
CANCELLED = "cancelled"  # the agent's word for the steps it did not run once the controller was gone


def facts(entries: list[dict]) -> dict:
    """The steps that finished and the one that failed; empty facts for a missing journal."""
    done = {e["op"]: e.get("value") for e in entries if e.get("event") == "done" and isinstance(e.get("op"), str)}
    failed = next((e for e in entries if e.get("event") == "failed"), None)
    stopped = [r for e in entries if e.get("event") == "done" and e.get("op") == "run_stop"  # a job's part, the rest
               and isinstance(e.get("value"), dict) for r in e["value"].get("stopped") or []]
    trash = done.get("ckpt_trash") if isinstance(done.get("ckpt_trash"), dict) else None
    begin = next((e for e in entries if e.get("event") == "begin"), {})
    planned = [op for op in begin.get("ops") or [] if isinstance(op, str)]
    return {"known": bool(entries), "planned": planned, "trash": trash, "stopped": stopped,
            "started": "run_start" in done, "failed": _failure(failed),
            "finished": any(e.get("event") == "end" for e in entries),
            "underway": any(e.get("event") == "underway" for e in entries)}  # its agent runs its steps now


def _failure(entry: dict | None) -> dict | None:
    if entry is None:
        return None
    error = entry.get("error") if isinstance(entry.get("error"), dict) else {}
    return {"op": entry.get("op"), "message": str(error.get("message") or "failed"), "kind": error.get("kind")}


def checkpoint_fields(told: dict) -> dict:
    """``checkpoints_action``/``checkpoints_entry`` for the launch's row: what its trash step did, if it ran."""
    trash = told.get("trash")
    if trash and trash.get("action") not in (None, "kept"):
        return {"checkpoints_action": trash["action"], "checkpoints_entry": trash.get("entry_path")}
    if trash or told.get("started") or (told.get("planned") and "ckpt_trash" not in told["planned"]):
        return {"checkpoints_action": "kept", "checkpoints_entry": None}  # a launch that never touches them too
    return {}


def start_failed(told: dict) -> bool:
    failed = told.get("failed")
    return bool(failed) and failed["op"] in START_OPS and failed["kind"] != CANCELLED


def where_checkpoints(told: dict) -> str:
    """``; its checkpoints were moved to … (orch checkpoints restore …)`` when its trash step moved them."""
    trash = told.get("trash") or {}
    if trash.get("action") == "moved" and trash.get("entry_path"):
        return f"; its checkpoints were moved to {trash['entry_path']} (orch checkpoints restore {trash['entry']})"
    return ""


def not_started(told: dict, default: str) -> str:
    """Why a launch that never started on the target failed, as far as its journal tells."""
    failed = told.get("failed")
    if failed and failed["kind"] != CANCELLED and failed["op"] is not None:
        return f"launch failed at {failed['op']}: {failed['message']}{where_checkpoints(told)}"[:2000]
    return f"{default}{where_checkpoints(told)}"


def stopped_reason(exp_id: int, told: dict) -> str:
    """How a run this launch stopped ended (``end_reason.stopped_by``)."""
    return stopped_by({"experiment": exp_id}, why=" (whose start then failed)" if start_failed(told) else "") or ""
