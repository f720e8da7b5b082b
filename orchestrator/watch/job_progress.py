"""Pure: how a job over several nodes is moving, from what each node reported (``orch status`` of a job).

A job moves while any node's log grows; one node printing nothing is normal (the non-zero ranks of most
DDP scripts are silent), so a quiet node is shown against the job's progress, not as an alarm::

    pair: experiment 3 running; the job moved 1 s ago (node 0)
      node 0 CT 200 ...: running, step 41, last line 1 s ago
      node 1 CT 201 ...: running, no output (node 1 prints nothing; the job moves)

Every age is measured by the node's own clock (its ``now`` beside its log's mtime), never the controller's.
"""

from __future__ import annotations

QUIET_S = 5.0  # a node this long without a line, while another moves, reads as quiet rather than recent
HEARD_S = 6.0  # a peer's heartbeat older than this (job.json is written every 2 s) is missing


def _age(now: object, then: object) -> float | None:
    if isinstance(now, (int, float)) and isinstance(then, (int, float)):
        return round(max(0.0, float(now) - float(then)), 1)
    return None


def node_facts(run: dict) -> dict:
    """The progress facts of a node's run as its agent reported it (``status``, with the node's ``now``)."""
    now = run.get("now")
    facts: dict = {"log_size": run.get("log_size"), "quiet_s": _age(now, run.get("log_mtime")),
                   "running_s": _age(now, run.get("started"))}
    beat = run.get("heartbeat")
    if isinstance(beat, dict):
        peers = beat.get("peers") if isinstance(beat.get("peers"), dict) else {}
        facts["heard_s"] = {str(r): _age(now, p.get("heard")) for r, p in peers.items() if isinstance(p, dict)}
        facts["heartbeat_error"] = beat.get("error")
    return facts


def summary(records: list[dict]) -> dict | None:
    """The job's newest progress among its running nodes: ``{"moved_s": 1.0, "by": 0}``; None if none runs."""
    live = [r for r in records if r.get("state") == "running" and r.get("quiet_s") is not None]
    if not live:
        return None
    best = min(live, key=lambda r: r["quiet_s"])
    return {"moved_s": best["quiet_s"], "by": best.get("rank")}


def job_note(moved: dict | None, stall_after: float | None) -> str:
    """What the job line says about its progress (``stall_after``: ``[run] stall_after``)."""
    if moved is None:
        return ""
    age = moved["moved_s"]
    if stall_after is not None and age >= stall_after / 2:
        return f"; no node has moved for {age:.0f} s (stalled at {stall_after:g} s: [run] stall_after)"
    if stall_after is None and age >= 60:
        return f"; no node has moved for {age:.0f} s"
    return f"; the job moved {age:.0f} s ago (node {moved['by']})"


def node_note(rec: dict, moved: dict | None, nnodes: int) -> list[str]:
    """What a running node's line says about its own output and the heartbeats it hears."""
    notes = []
    quiet = rec.get("quiet_s")
    others_move = moved is not None and moved.get("by") != rec.get("rank")
    if not rec.get("last_line"):
        notes.append(f"no output (node {rec.get('rank')} prints nothing" + ("; the job moves)" if others_move else ")"))
    elif quiet is not None and quiet >= QUIET_S and others_move and moved["moved_s"] + 1 < quiet:  # type: ignore[index]
        notes.append(f"quiet for {quiet:.0f} s while the job moves")
    elif quiet is not None:
        notes.append(f"last line {quiet:.0f} s ago")
    if rec.get("heartbeat_error"):
        notes.append(f"{rec['heartbeat_error']}: stalls judged on its own log")
    heard = rec.get("heard_s")
    if isinstance(heard, dict) and (rec.get("running_s") or 0) > HEARD_S:
        missing = [str(r) for r in range(nnodes) if r != rec.get("rank")
                   and (heard.get(str(r)) is None or heard[str(r)] > HEARD_S)]
        if missing:
            notes.append(f"no heartbeat from node {', '.join(missing)} (UDP: [distributed] heartbeat_port)")
    return notes
