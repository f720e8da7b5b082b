"""Batching under a token budget: a batch of ``n`` samples padded to its longest costs ``n * max_len``.

Pure numpy and importable on its own (training machines get this package alone, in a zip)::

    from orchestrator.batching import BatchSampler, build_batches, load_lengths
    batches = build_batches(load_lengths("lengths.npy"), {"token_budget": 49152}, epoch=3)

Strategies: ``sorted`` (the throughput reference), ``shuffle``, ``bucketed`` (given or optimized
boundaries), ``megabatch`` (the default; M chosen from the data). The batch order is stratified by
longest sample over windows of ``window`` steps for every strategy.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_HOMES = {  # each public name and the module that defines it
    "DEFAULTS": "config",
    "BatchSampler": "sampler",
    "build_batches": "build",
    "complete": "build",
    "load_lengths": "lengths",
    "metrics": "metrics",
    "normalize": "config",
    "optimal_boundaries": "buckets",
    "padded_cost": "buckets",
    "plan": "planner",
    "quantile_boundaries": "buckets",
    "resolve": "planner",
}
__all__ = list(_HOMES)


def __getattr__(name: str) -> Any:
    """The public names load on first use, so that orch's settings can read the key table
    (``batching.config``, stdlib only) without importing numpy."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    modules = {home: import_module(f".{home}", __name__) for home in set(_HOMES.values())}
    # bound after every import: a submodule's import binds its own name (``metrics``) to the module
    globals().update({n: getattr(modules[home], n) for n, home in _HOMES.items()})
    return globals()[name]
