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


def table(spec: dict, trials: list[dict], metric: str | None, error: str | None = None,
          resumed: dict | None = None) -> dict[str, Any]:
    """``resumed``: the experiment each trial resumed by ``orch sweep resume --trial`` runs as, by trial number."""
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
                     "budget_steps": attrs.get("budget_steps"), "error": attrs.get("error"),
                     "resumed": ((resumed or {}).get(str(t["number"])) or {}).get("experiment"), "best": False})
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


def coordinates(table: dict, space: dict) -> dict[str, Any]:
    """Each ended trial's place on every axis of a parallel-coordinates plot, from 0 to 1: a range by its bounds
    (a log range by its logarithm), a choice by its position, the objective from the best to the worst seen."""
    import math

    from .space import Choice

    names = [k for k in table["keys"]
             if k in space and not (isinstance(space[k], Choice) and len(space[k].values) == 1)]
    # a trial that lacks a value of an axis (one an older orch ran after its conductor ended inside the ask) has no
    # place on the plot: left out of it, never a failed ``sweep show``
    rows = [r for r in table["rows"] if r["state"] in ("complete", "pruned") and r["objective"] is not None
            and all(k in r["params"] for k in names)]
    values = [r["objective"] for r in rows]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)

    def place(key: str, value: Any) -> float:
        dist = space[key]
        if isinstance(dist, Choice):
            return dist.values.index(str(value)) / max(1, len(dist.values) - 1)
        if dist.log:
            return (math.log(float(value)) - math.log(dist.low)) / (math.log(dist.high) - math.log(dist.low))
        return (float(value) - dist.low) / (dist.high - dist.low)

    def span(key: str) -> tuple[str, str]:
        dist = space[key]
        return (dist.values[0], dist.values[-1]) if isinstance(dist, Choice) else (f"{dist.low:g}", f"{dist.high:g}")

    better_low = table["mode"] == "min"
    lines = [{"trial": r["trial"], "state": r["state"],
              "y": [place(k, r["params"][k]) for k in names]
              + [((r["objective"] - lo) / (hi - lo) if hi > lo else 0.5) if better_low
                 else ((hi - r["objective"]) / (hi - lo) if hi > lo else 0.5)]} for r in rows]
    best = next((ln for ln, r in zip(lines, rows) if r["best"]), None)
    return {"axes": [*names, table["metric"]], "lines": lines, "best": best,
            "ticks": [span(k) for k in names] + [(f"{lo:.4g}", f"{hi:.4g}") if better_low else (f"{hi:.4g}", f"{lo:.4g}")],
            "scatter": {k: [(float(r["params"][k]) if not isinstance(space[k], Choice) else str(r["params"][k]),
                             r["objective"], r["state"]) for r in rows] for k in names},
            "log": {k: bool(getattr(space[k], "log", False)) for k in names},
            "title": f"sweep {table['sweep']}: {len(rows)} trials ({sum(r['state'] == 'pruned' for r in rows)} "
                     f"pruned, grey), {table['metric']} ({table['mode']}) on the last axis, best at the bottom"}
