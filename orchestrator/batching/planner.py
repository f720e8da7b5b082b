"""What orch records with a launch (``resolve``) and the comparison table (``plan``).

Both build epochs 0 and 1 of the config's seed and measure them with ``metrics``; efficiency is
also given relative to sorted-greedy on the same data, which predicts throughput relative to
recipe (a) (step time is proportional to padded tokens).
"""

from __future__ import annotations

import time

from .build import complete
from .config import normalize
from .megabatch import sorted_efficiency
from .metrics import metrics
from .strategies import Prepared, build_epoch, prepare

#: Hugging Face's megabatch size (50 batches), shown for comparison when none is configured.
HF_MEGABATCH = 50

PLANNED_KEYS = ("efficiency", "efficiency_vs_sorted", "budget_fill", "d1", "d2", "s_and_l", "batches")


def _measure(prepared: Prepared, lengths, cfg: dict, reference: float) -> dict:
    started = time.perf_counter()
    first = build_epoch(prepared, cfg, 0)
    build_ms = (time.perf_counter() - started) * 1000
    second = build_epoch(prepared, cfg, 1)
    out = metrics(lengths, first, second, cfg["token_budget"], cfg["window"],
                  max_seq_len=cfg["max_seq_len"], sorted_efficiency=reference)
    out["build_ms"] = build_ms
    return out


def resolve(lengths, config=None) -> dict:
    """``{"config": the explicit config, "planned": its predicted metrics}`` for recording a launch.

    ``config`` has buckets / megabatch filled in where they were chosen from the data, so passing
    it to ``build_batches`` rebuilds the same batches without searching again.
    """
    cfg = normalize(config)
    prepared = prepare(lengths, cfg)
    timings: dict = {}
    resolved = complete(prepared, cfg, timings)
    if len(prepared.length) == 0:
        raise ValueError("no samples left to batch (all were dropped as overlong)")
    reference = sorted_efficiency(prepared.length, resolved)
    measured = _measure(prepared, lengths, resolved, reference)
    planned = {key: measured[key] for key in PLANNED_KEYS}
    planned.update(build_ms=measured["build_ms"], choose_ms=timings["choose_ms"], overlong=prepared.overlong)
    return {"config": resolved, "planned": planned}


def _variants(cfg: dict) -> list[tuple[str, dict, bool]]:
    """(name, config overrides, is this what the config runs) for every row of the plan."""
    strategy = cfg["strategy"]
    rows = [("sorted", {"strategy": "sorted"}, strategy == "sorted"),
            ("shuffle", {"strategy": "shuffle"}, strategy == "shuffle")]
    if cfg["buckets"] is not None:
        rows.append((f"bucketed K={len(cfg['buckets']) - 1} given", {"strategy": "bucketed"},
                     strategy == "bucketed"))
    rows.append((f"bucketed K={cfg['num_buckets']} optimized", {"strategy": "bucketed", "buckets": None},
                 strategy == "bucketed" and cfg["buckets"] is None))
    fixed = cfg["megabatch"] or HF_MEGABATCH
    rows.append((f"megabatch M={fixed}" + ("" if cfg["megabatch"] else " HF"),
                 {"strategy": "megabatch", "megabatch": fixed},
                 strategy == "megabatch" and cfg["megabatch"] is not None))
    rows.append(("megabatch M=auto auto", {"strategy": "megabatch", "megabatch": None},
                 strategy == "megabatch" and cfg["megabatch"] is None))
    return rows


def plan(lengths, config=None, window: int | None = None) -> list[dict]:
    """One row per strategy with efficiency, throughput vs sorted, D1, D2, S&L, batches and timings.

    Exactly one row has ``recommended: True``: the freshest (lowest D1) of those within
    ``target_efficiency`` of sorted-greedy whose windows all mix short and long samples, or the
    most efficient row when none qualifies. ``configured: True`` marks the row the config runs.
    """
    cfg = normalize(config if window is None else {**normalize(config), "window": window})
    prepared = prepare(lengths, cfg)
    if len(prepared.length) == 0:
        raise ValueError("no samples left to batch (all were dropped as overlong)")
    reference = sorted_efficiency(prepared.length, cfg)
    rows = []
    for name, overrides, configured in _variants(cfg):
        row_cfg = {**cfg, **overrides}
        timings: dict = {}
        resolved = complete(prepared, row_cfg, timings)
        measured = _measure(prepared, lengths, resolved, reference)
        rows.append({
            "name": name.replace("M=auto", f"M={resolved['megabatch']}"),
            "strategy": resolved["strategy"],
            "order": f"stratified G={cfg['window']}" if cfg["window"] > 1 else "random",
            **{key: measured[key] for key in PLANNED_KEYS},
            "throughput_vs_sorted": measured["efficiency_vs_sorted"],
            "build_ms": measured["build_ms"],
            "choose_ms": timings["choose_ms"],
            "config": resolved,
            "configured": configured,
            "recommended": False,
            # True where the config left a choice to the data (optimized buckets, M from data)
            "auto": None in (overrides.get("buckets", 0), overrides.get("megabatch", 0)),
        })
    goal = cfg["target_efficiency"]
    qualified = [r for r in rows if r["efficiency_vs_sorted"] >= goal and r["s_and_l"] >= 1.0]
    if qualified:
        best = min(qualified, key=lambda r: (r["d1"], -r["efficiency"]))
    else:
        best = max(rows, key=lambda r: r["efficiency"])
    best["recommended"] = True
    return rows
