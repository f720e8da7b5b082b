"""Batching under a token budget: a batch of ``n`` samples padded to its longest costs ``n * max_len``.

Pure numpy and importable on its own (training machines get this package alone, in a zip)::

    from orchestrator.batching import BatchSampler, build_batches, load_lengths
    batches = build_batches(load_lengths("lengths.npy"), {"token_budget": 49152}, epoch=3)

Strategies: ``sorted`` (the throughput reference), ``shuffle``, ``bucketed`` (given or optimized
boundaries), ``megabatch`` (the default; M chosen from the data). The batch order is stratified by
longest sample over windows of ``window`` steps for every strategy.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "DEFAULTS",
    "BatchSampler",
    "build_batches",
    "complete",
    "load_lengths",
    "metrics",
    "normalize",
    "optimal_boundaries",
    "padded_cost",
    "plan",
    "quantile_boundaries",
    "resolve",
]


def __getattr__(name: str) -> Any:
    """The public names load on first use, so that orch's settings can read the key table
    (``batching.config``, stdlib only) without importing numpy."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .buckets import optimal_boundaries, padded_cost, quantile_boundaries
    from .build import build_batches, complete
    from .config import DEFAULTS, normalize
    from .lengths import load_lengths
    from .metrics import metrics
    from .planner import plan, resolve
    from .sampler import BatchSampler

    found = locals()
    globals().update({n: found[n] for n in __all__})  # after the imports: `metrics` is the function
    return found[name]
