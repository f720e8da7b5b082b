"""``build_batches``: one epoch's batches for a config, and ``complete``: the config made explicit.

``complete`` fills in what the config leaves to the data: optimized bucket boundaries for
``bucketed`` without ``buckets``, and the megabatch size M for ``megabatch`` without ``megabatch``.
Choosing takes a few builds, so results are cached per (lengths, relevant keys) for the process.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict

import numpy as np

from .buckets import optimal_boundaries
from .config import normalize
from .megabatch import choose_megabatch
from .strategies import Prepared, build_epoch, check_rank, prepare, shard

_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 16


def _cached(key, compute):
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    value = compute()
    _CACHE[key] = value
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return value


def _digest(length: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(length).view(np.uint8), digest_size=16).hexdigest()


def complete(prepared: Prepared, cfg: dict, timings: dict | None = None) -> dict:
    """``cfg`` with bucket boundaries / megabatch size chosen from the data where it left them to it."""
    out = dict(cfg)
    started = time.perf_counter()
    if len(prepared.length) == 0:  # nothing to choose from; an empty epoch has no batches
        pass
    elif out["strategy"] == "bucketed" and out["buckets"] is None:
        key = ("buckets", _digest(prepared.length), out["num_buckets"], out["max_seq_len"])
        out["buckets"] = list(_cached(
            key, lambda: optimal_boundaries(prepared.length, out["num_buckets"], out["max_seq_len"])))
    elif out["strategy"] == "megabatch" and out["megabatch"] is None:
        key = ("megabatch", _digest(prepared.length), out["token_budget"], out["max_seq_len"], out["target_efficiency"])
        out["megabatch"] = _cached(key, lambda: choose_megabatch(prepared.length, out))
    if timings is not None:
        timings["choose_ms"] = (time.perf_counter() - started) * 1000
    return out


def build_batches(lengths, config=None, epoch: int = 0, rank: int = 0, world_size: int = 1) -> list[np.ndarray]:
    """The epoch's batches in training order, as arrays of sample indices, for this rank.

    Deterministic in (seed, epoch); every rank computes the same global list and takes the
    positions ``rank, rank + world_size, ...`` of its first ``world_size * (len // world_size)``.

        >>> cfg = {"strategy": "sorted", "token_budget": 10, "max_seq_len": 8}
        >>> sorted(b.tolist() for b in build_batches([5, 3, 8, 2], cfg))  # 8 | 5+3 padded to 10 | 2
        [[0, 1], [2], [3]]
    """
    check_rank(rank, world_size)
    if isinstance(epoch, bool) or int(epoch) != epoch or epoch < 0:
        raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
    cfg = normalize(config)
    prepared = prepare(lengths, cfg)
    return shard(build_epoch(prepared, complete(prepared, cfg), int(epoch)), rank, world_size)
