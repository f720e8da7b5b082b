"""Bucket boundaries: the exact optimum for K buckets, and the quantile baseline.

A bucket ``(a, b]`` pads every sample to the bucket's longest sample, so a set of boundaries costs
``sum over buckets of count * longest`` padded tokens (batches of ``budget // longest`` samples keep
every batch within the budget). ``optimal_boundaries`` minimises that cost exactly by dynamic
programming over the histogram of distinct lengths; each layer is a lower envelope of lines
(convex-hull trick) in exact integer arithmetic, O(K * V) for V distinct lengths.

    >>> optimal_boundaries(np.array([1, 1, 2, 9, 10]), 2, max_seq_len=16)
    [0, 2, 16]
"""

from __future__ import annotations

import numpy as np


def _histogram(lengths: np.ndarray) -> tuple[list[int], list[int]]:
    values, counts = np.unique(np.maximum(np.asarray(lengths, dtype=np.int64), 1), return_counts=True)
    return values.tolist(), counts.tolist()


def padded_cost(lengths: np.ndarray, boundaries: list[int]) -> int:
    """Padded tokens when each sample is padded to the longest sample of its bucket."""
    lens = np.maximum(np.asarray(lengths, dtype=np.int64), 1)
    if lens.size == 0:
        return 0
    bucket = np.searchsorted(np.asarray(boundaries[1:-1]), lens, side="left")
    nb = len(boundaries) - 1
    counts = np.bincount(bucket, minlength=nb)
    longest = np.zeros(nb, dtype=np.int64)
    np.maximum.at(longest, bucket, lens)
    return int((counts * longest).sum())


def optimal_boundaries(lengths: np.ndarray, k: int, max_seq_len: int) -> list[int]:
    """The K-bucket boundaries ``[0, b1, ..., max_seq_len]`` with the least padded cost.

    Inner boundaries are lengths present in the data (a bucket ends at its longest sample); with
    fewer than K distinct lengths every distinct length gets its own bucket.
    """
    if k < 1:
        raise ValueError(f"number of buckets must be >= 1, got {k}")
    values, counts = _histogram(lengths)
    if not values:
        raise ValueError("cannot optimize buckets for an empty dataset")
    if values[-1] > max_seq_len:
        raise ValueError(f"lengths exceed max_seq_len={max_seq_len}; apply the overlong policy first")
    v = len(values)
    if k >= v:
        return [0] + values[:-1] + [max_seq_len]
    cum = [0]
    for c in counts:
        cum.append(cum[-1] + c)
    # prev[j]: least cost of covering the first j distinct values with (layer) buckets.
    prev = [None] + [cum[j] * values[j - 1] for j in range(1, v + 1)]
    choices: list[list[int]] = []
    for layer in range(2, k + 1):
        cur: list = [None] * (v + 1)
        arg = [0] * (v + 1)
        slopes: list[int] = []  # line i: prev[i] - cum[i] * x
        inters: list[int] = []
        ids: list[int] = []
        head = 0
        last_j = v - (k - layer)  # later layers need at least one value per remaining bucket
        for j in range(layer, last_j + 1):
            i = j - 1
            m, c = -cum[i], prev[i]
            # Drop lines from the back that the new line makes irrelevant (exact integer test).
            while len(ids) - head >= 2:
                m1, c1 = slopes[-2], inters[-2]
                m2, c2 = slopes[-1], inters[-1]
                if (c - c1) * (m1 - m2) <= (c2 - c1) * (m1 - m):
                    slopes.pop(); inters.pop(); ids.pop()
                else:
                    break
            slopes.append(m); inters.append(c); ids.append(i)
            head = min(head, len(ids) - 1)
            x = values[j - 1]
            while len(ids) - head >= 2 and inters[head + 1] + slopes[head + 1] * x <= inters[head] + slopes[head] * x:
                head += 1
            cur[j] = inters[head] + slopes[head] * x + cum[j] * x
            arg[j] = ids[head]
        choices.append(arg)
        prev = cur
    # Walk back from the full range to the bucket ends.
    ends = [v]
    j = v
    for arg in reversed(choices):
        j = arg[j]
        ends.append(j)
    ends.reverse()  # ends[0] is where the first bucket ends
    return [0] + [values[e - 1] for e in ends[:-1]] + [max_seq_len]


def quantile_boundaries(lengths: np.ndarray, k: int, max_seq_len: int) -> list[int]:
    """Equal-count boundaries (the baseline the optimizer must never lose to)."""
    lens = np.sort(np.maximum(np.asarray(lengths, dtype=np.int64), 1))
    if lens.size == 0:
        raise ValueError("cannot compute buckets for an empty dataset")
    cuts = [int(lens[min(len(lens) - 1, (len(lens) * q) // k)]) for q in range(1, k)]
    inner = sorted({c for c in cuts if 0 < c < max_seq_len})
    return [0] + inner + [max_seq_len]
