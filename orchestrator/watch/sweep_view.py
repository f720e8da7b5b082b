"""``orch sweep show``: one row per variant of a sweep, ranked by throughput, the best marked.

Throughput is compared over the same step window for every variant: from a tenth of the way in (past the
warm-up) to the last step that every variant with metrics reached, so a variant still running or cut short
is not judged on a different stretch. Loss is read at that same last step, the eval loss (``val_loss``, else
``test_loss``) at the last evaluation up to it. Beside them: the batching plan's
padding efficiency as the planner recorded it at launch (``batching_plan``, with ``[batching] lengths``).

    rows(registry, "s1a2b3c") -> {"sweep": ..., "window": [20, 200], "keys": [...], "variants": [...]}
"""

from __future__ import annotations

from typing import Any

from ..errors import NotFoundError
from ..records.experiments import Experiment, Registry
from .compare import _fields, _fmt
from .metrics import Series
from .metrics_view import EVAL_LOSSES

WARMUP = 0.1  # the share of the window's steps left out at its start


def _points(stored: dict | None, key: str) -> list[tuple[float, float]]:
    series = (stored or {}).get("series", {})
    return Series.from_dict(series[key]).points() if key in series else []


def _rate_key(stored: list[dict | None]) -> str:
    for key in ("tok_s", "steps_s", "samples_s"):
        if any(_points(s, key) for s in stored):
            return key
    return "tok_s"


def _differing(exps: list[Experiment]) -> list[str]:
    flats = [_fields(e) for e in exps]
    keys = sorted(set().union(*flats), key=lambda k: (not k.startswith("batching."), k)) if flats else []
    skip = ("batching.lengths", "env.ORCH_MAX_STEPS", "env.ORCH_MAX_MINUTES")
    return [k for k in keys if k not in skip and any(f.get(k) != flats[0].get(k) for f in flats[1:])]


def rows(registry: Registry, sweep: str) -> dict[str, Any]:
    exps = sorted(registry.list(sweep=sweep), key=lambda e: e.id)
    if not exps:
        raise NotFoundError(f"no sweep {sweep!r} in {registry.path}",
                            hint="orch experiments list shows each experiment's sweep")
    stored = [registry.metrics(e.id) for e in exps]
    rate = _rate_key(stored)
    reached = [max(x for x, _ in pts) for s in stored if (pts := _points(s, "loss") or _points(s, rate))]
    high = min(reached) if reached else None
    low = high * WARMUP if high is not None else None
    keys = _differing(exps)
    out = []
    for exp, s in zip(exps, stored):
        flat = _fields(exp)
        window = [y for x, y in _points(s, rate) if high is not None and low < x <= high]
        loss = [y for x, y in _points(s, "loss") if high is not None and x <= high]
        evals = next((pts for key in EVAL_LOSSES if (pts := _points(s, key))), [])
        eval_loss = [y for x, y in evals if high is not None and x <= high] or [y for _, y in evals[-1:]]
        plan = exp.batching_plan or {}
        out.append({"id": exp.id, "settings": {k: _fmt(flat.get(k)) for k in keys}, "status": exp.status,
                    "throughput": sum(window) / len(window) if window else None, "throughput_unit":
                    rate.replace("_", "/"), "loss": loss[-1] if loss else None,
                    "eval_loss": eval_loss[-1] if eval_loss else None,
                    "efficiency": plan.get("efficiency"), "end_reason": exp.end_reason, "target": exp.target,
                    "best": False})
    ranked = sorted(out, key=lambda r: -(r["throughput"] or -1.0))
    if ranked and ranked[0]["throughput"] is not None:
        ranked[0]["best"] = True
    return {"sweep": sweep, "window": [low, high] if high is not None else None, "keys": keys,
            "variants": ranked}
