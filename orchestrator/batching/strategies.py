"""One epoch of batches for each strategy, and the batch order.

Every builder works on *effective* lengths (after the overlong policy, zero counted as one token
because a sample still occupies a row) and returns ``(order, cuts)``: sample positions in batch
order and the offsets where batches start. ``build_epoch`` then orders the batches (stratified or
random) and maps positions back to dataset indices.

Randomness comes from one ``numpy.random.Generator`` seeded with ``(seed, epoch)``; every sort uses
unique keys (or a stable sort), so every machine computes the same batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import pack


@dataclass
class Prepared:
    """The samples that take part in batching, after the overlong policy."""

    index: np.ndarray  # dataset index of each kept sample
    length: np.ndarray  # its effective length (1..max_seq_len), int64
    overlong: dict = field(default_factory=dict)


def as_lengths(lengths) -> np.ndarray:
    """Validate a 1-D array of non-negative integer lengths; returns int64."""
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise ValueError(f"lengths must be a 1-D sequence, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise ValueError(f"lengths must be integers, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.floating):
        bad = ~np.isfinite(arr) | (arr != np.floor(arr))
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"lengths must be integers; sample {i} has length {arr[i]!r}")
    if arr.min() < 0:
        i = int(np.argmin(arr))
        raise ValueError(f"lengths must be >= 0; sample {i} has length {arr[i]}")
    return arr.astype(np.int64, copy=False)


def prepare(lengths, cfg: dict) -> Prepared:
    """Apply the overlong policy (``error`` raises, ``truncate`` caps at max_seq_len, ``drop`` leaves
    the sample out of every batch) and count what it did."""
    arr = as_lengths(lengths)
    cap = cfg["max_seq_len"]
    over = arr > cap
    n_over = int(over.sum())
    policy = cfg["overlong"]
    counts = {"policy": policy, "overlong": n_over, "truncated": 0, "dropped": 0, "total": int(arr.size),
              "longest": int(arr.max()) if arr.size else 0}
    if n_over and policy == "error":
        raise ValueError(
            f"{n_over} of {arr.size} samples are longer than max_seq_len={cap} (longest {counts['longest']});"
            " set batching.overlong to 'truncate' or 'drop', or raise max_seq_len"
        )
    if n_over and policy == "drop":
        index = np.flatnonzero(~over)
        length = arr[index]
        counts["dropped"] = n_over
    else:
        index = np.arange(arr.size, dtype=np.int64)
        length = np.minimum(arr, cap) if n_over else arr
        counts["truncated"] = n_over
    return Prepared(index=index, length=np.maximum(length, 1), overlong=counts)


def _descending_key_order(length: np.ndarray, group: np.ndarray | None, cap: int) -> np.ndarray:
    """Positions sorted by (group, longest first, position).

    The three are packed into one unique int64 key and sorted by value, which is several times
    faster than an argsort and, the keys being unique, gives the same result on every machine.
    """
    n = len(length)
    key = (cap - length).astype(np.int64)
    if group is not None:
        key += group.astype(np.int64) * (cap + 1)
    shift = max(n - 1, 1).bit_length()
    if int(key.max(initial=0)) >= 2 ** (62 - shift):
        return np.lexsort((np.arange(n), key))
    key <<= shift
    key |= np.arange(n, dtype=np.int64)
    key.sort()
    key &= (1 << shift) - 1
    return key


def build_sorted(length: np.ndarray, cfg: dict, rng) -> tuple[np.ndarray, np.ndarray]:
    order = _descending_key_order(length, None, cfg["max_seq_len"])
    return order, pack.cuts_descending(length[order], cfg["token_budget"])


def build_shuffle(length: np.ndarray, cfg: dict, rng) -> tuple[np.ndarray, np.ndarray]:
    order = rng.permutation(len(length))
    return order, pack.cuts_greedy(length[order], cfg["token_budget"])


def bucket_of(length: np.ndarray, boundaries: list[int]) -> np.ndarray:
    """Bucket k holds ``boundaries[k] < length <= boundaries[k+1]``."""
    return np.searchsorted(np.asarray(boundaries[1:-1]), length, side="left")


def build_bucketed(length: np.ndarray, cfg: dict, rng) -> tuple[np.ndarray, np.ndarray]:
    boundaries = cfg["buckets"]
    if boundaries is None:
        raise ValueError("bucketed strategy needs batching.buckets (resolve() fills in optimized ones)")
    perm = rng.permutation(len(length))
    bucket = bucket_of(length[perm], boundaries).astype(np.int16 if len(boundaries) < 2**15 else np.int64)
    order = perm[np.argsort(bucket, kind="stable")]
    ends = np.cumsum(np.bincount(bucket, minlength=len(boundaries) - 1))
    return order, pack.cuts_greedy(length[order], cfg["token_budget"], ends)


def build_megabatch(length: np.ndarray, cfg: dict, rng) -> tuple[np.ndarray, np.ndarray]:
    """A fresh random permutation cut into chunks of M batches' worth of tokens (``M * token_budget``);
    each chunk is sorted longest-first and packed, so no batch crosses a chunk."""
    if cfg["megabatch"] is None:
        raise ValueError("megabatch strategy needs batching.megabatch (resolve() chooses one from the data)")
    perm = rng.permutation(len(length))
    lp = length[perm]
    before = np.cumsum(lp)
    before -= lp  # tokens ahead of each sample in the permutation
    chunk = before // (cfg["megabatch"] * cfg["token_budget"])
    order = perm[_descending_key_order(lp, chunk, cfg["max_seq_len"])]
    ends = np.cumsum(np.bincount(chunk))
    return order, pack.cuts_descending(length[order], cfg["token_budget"], ends)


BUILDERS = {
    "sorted": build_sorted,
    "shuffle": build_shuffle,
    "bucketed": build_bucketed,
    "megabatch": build_megabatch,
}


def batch_order(longest: np.ndarray, window: int, rng) -> np.ndarray:
    """The order of batches: random for ``window == 1``, else stratified by longest sample.

    Batches are ranked by their longest sample and split into ``window`` strata of equal size;
    every window of ``window`` consecutive steps takes one batch from each stratum, in random
    order. The ``len % window`` batches left over (chosen at random) form a last, partial window.
    """
    nb = len(longest)
    perm = rng.permutation(nb)
    if window <= 1 or nb < window:
        return perm
    per = nb // window
    extra, main = perm[: nb - per * window], perm[nb - per * window :]
    strata = main[np.argsort(longest[main], kind="stable")].reshape(window, per)
    strata = rng.permuted(strata, axis=1)  # which batch of each stratum lands in which window
    windows = rng.permuted(strata.T, axis=1)  # which stratum comes first inside each window
    return np.concatenate((windows.ravel(), extra))


def build_epoch(prepared: Prepared, cfg: dict, epoch: int) -> list[np.ndarray]:
    """All batches of one epoch, in training order, as arrays of dataset indices."""
    rng = np.random.default_rng([cfg["seed"], epoch])
    length = prepared.length
    if len(length) == 0:
        return []
    order, cuts = BUILDERS[cfg["strategy"]](length, cfg, rng)
    ordered_len = length[order]
    longest = pack.batch_max(ordered_len, cuts)
    index = prepared.index[order]
    starts = cuts.tolist()
    stops = starts[1:] + [len(index)]
    return [index[starts[i]:stops[i]] for i in batch_order(longest, cfg["window"], rng).tolist()]


def shard(batches: list[np.ndarray], rank: int, world_size: int) -> list[np.ndarray]:
    """Rank ``rank``'s equal share: global positions ``rank, rank + W, ...`` of the first ``W * floor(nb / W)``.

    With G micro-batches per rank per optimizer step, an optimizer step covers ``G * W`` consecutive
    global batches, which are whole stratified windows, so every step stays mixed.
    """
    check_rank(rank, world_size)
    if world_size == 1:
        return batches
    usable = len(batches) - len(batches) % world_size
    return batches[rank:usable:world_size]


def check_rank(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size) and world_size >= 1, "
                         f"got rank={rank}, world_size={world_size}")
