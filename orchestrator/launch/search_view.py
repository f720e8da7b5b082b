"""``orch sweep show`` for a search: its trials ranked, best first, with what pruning saved (pure).

Complete trials come first by their objective, then pruned ones (the furthest rung first), then those still
running or queued, then failed ones. What pruning saved is counted in steps: every trial's budget against the
steps its trials ran, which is the GPU time the sweep did not spend.

    table(spec, trials, metric) -> {"sweep": ..., "trials": [...], "steps_run": 480, "steps_budget": 1200, ...}
"""

from __future__ import annotations

from typing import Any

ORDER = {"complete": 0, "pruned": 1, "running": 2, "waiting": 2, "failed": 3}


def _key(row: dict, mode: str) -> tuple:
    sign = 1 if mode == "min" else -1
    value = row["objective"]
    rung = -(row["rung"] or 0)
    return (ORDER.get(row["state"], 4), rung if row["state"] == "pruned" else 0,
            sign * value if value is not None else float("inf"), row["trial"])


def table(spec: dict, trials: list[dict], metric: str | None, error: str | None = None) -> dict[str, Any]:
    rows = []
    for t in trials:
        attrs = t["attrs"]
        pruned = attrs.get("pruned") or {}
        last = max(t["intermediate"].items(), default=(None, None))
        objective = t["value"] if t["state"] == "complete" else pruned.get("value", last[1])
        rows.append({"trial": t["number"], "experiment": attrs.get("experiment"), "state": t["state"],
                     "params": t["params"], "objective": objective, "rung": pruned.get("rung") or attrs.get("rungs"),
                     "rung_at": pruned.get("at"), "threshold": pruned.get("threshold"),
                     "steps": attrs.get("steps"), "tokens": attrs.get("tokens"),
                     "budget_steps": attrs.get("budget_steps"), "error": attrs.get("error"), "best": False})
    rows.sort(key=lambda r: _key(r, spec["mode"]))
    if rows and rows[0]["state"] == "complete":
        rows[0]["best"] = True
    ended = [r for r in rows if r["state"] in ("complete", "pruned", "failed") and r["steps"] is not None]
    run = sum(r["steps"] for r in ended)
    budget = sum(r["budget_steps"] or spec["steps"] for r in ended)
    return {"sweep": spec["sweep"], "metric": metric or spec["metric"], "mode": spec["mode"],
            "sampler": spec["sampler"], "prune": spec["prune"], "rung_by": spec["rung_by"],
            "trials_asked": len(trials), "trials": spec["trials"], "keys": sorted({k for t in trials for k in t["params"]}),
            "rows": rows, "steps_run": run, "steps_budget": budget,
            "saved": (1 - run / budget) if budget else None, "error": error}
