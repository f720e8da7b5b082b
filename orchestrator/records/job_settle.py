"""When a job's row is final, and what it says (pure): settled only once every node is.

Each node record carries what its agent reported (``state``, ``exit_code``, ``ended``, ``reason``). While
any node runs, launches, could not be read or has a stop not yet delivered, the job is not settled::

    settle([{"rank": 0, "state": "stopped", "ended": 100.0, "reason": "stopped by torchrun"},
            {"rank": 1, "state": "crashed", "exit_code": 3, "ended": 90.0, "reason": "exit code 3"}])
      -> {"status": "crashed", "ended": 100.0, "exit_code": 3,
          "end_reason": "node 1 crashed (exit code 3); node 0 stopped (stopped by torchrun)"}

The job ends when its last node does; its reason names every node, the first to end first.
"""

from __future__ import annotations

FINAL_NODE = ("finished", "crashed", "stopped", "failed", "lost")


def state(states: list[str | None], codes: list[int | None]) -> str:
    """A job's state from its nodes': running while any runs, finished when all exited 0."""
    if any(s in ("running", "launching") for s in states):
        return "running"
    if all(s == "finished" and c == 0 for s, c in zip(states, codes)):
        return "finished"
    if states and all(s == "failed" for s in states):
        return "failed"
    if any(s == "stopped" for s in states) and all(s in ("stopped", "finished") for s in states):
        return "stopped"
    return "crashed"


def node_final(rec: dict) -> bool:
    """Whether a node's record can no longer change: reached, ended, no stop owed to it."""
    return rec.get("reachable", True) and not rec.get("stop_pending") and rec.get("state") in FINAL_NODE


def exit_code(records: list[dict]) -> int | None:
    """The first non-zero exit code of the nodes, else the first one known."""
    codes = [r["exit_code"] for r in records if r.get("exit_code") is not None]
    return next((c for c in codes if c != 0), codes[0] if codes else None)


def node_words(rec: dict) -> str:
    """``node 1 crashed (exit code 3)``; ``node 0 finished``."""
    why = rec.get("reason")
    if why is None and rec.get("state") == "crashed" and rec.get("exit_code") is not None:
        why = f"exit code {rec['exit_code']}"
    return f"node {rec.get('rank')} {rec.get('state')}" + (f" ({why})" if why else "")


def _by_end(records: list[dict]) -> list[dict]:
    """The first to end first (a node without an end time last)."""
    return sorted(records, key=lambda r: (r.get("ended") is None, r.get("ended") or 0.0, r.get("rank") or 0))


def reason(records: list[dict]) -> str:
    """Every node's end, the first to end first."""
    return "; ".join(node_words(r) for r in _by_end(records))


def _cause_code(records: list[dict]) -> int | None:
    """The exit code of the first node that crashed (the others mostly went down with it), else the first
    non-zero one, else 0."""
    order = _by_end(records)
    crashed = [r["exit_code"] for r in order if r.get("state") == "crashed" and r.get("exit_code") not in (None, 0)]
    return crashed[0] if crashed else exit_code(order)


def settle(records: list[dict]) -> dict | None:
    """The job's final fields once every node is final, else None (the row stays as it is)."""
    if not records or not all(node_final(r) for r in records):
        return None
    ends = [r["ended"] for r in records if r.get("ended") is not None]
    return {"status": state([r.get("state") for r in records], [r.get("exit_code") for r in records]),
            "ended": max(ends) if ends else None, "exit_code": _cause_code(records), "end_reason": reason(records)}
