"""Greedy packing under a token budget: a batch of ``n`` samples costs ``n * max_len <= budget``.

Both packers return *cut points*: the offsets in ``order`` where a new batch starts. Segments
(buckets, megabatches) are packed independently: no batch crosses a segment end.

- ``cuts_descending`` needs each segment sorted longest-first. The first sample of a batch is its
  longest, so the batch size is ``budget // length`` and the work is one step per batch.
- ``cuts_greedy`` takes any order and tracks the true running maximum, one step per sample.

Both close a batch exactly when adding the next sample would exceed the budget, so for the same
order they produce the same batches (the tests check this against a plain reference packer).
"""

from __future__ import annotations

import numpy as np


def _segment_ends(n: int, ends: np.ndarray | None) -> list[int]:
    if ends is None:
        return [n] if n else []
    return [int(e) for e in ends]


def cuts_descending(lengths_in_order: np.ndarray, budget: int, ends: np.ndarray | None = None) -> np.ndarray:
    """Batch starts for segments already sorted longest-first (lengths >= 1)."""
    n = len(lengths_in_order)
    caps = memoryview(np.ascontiguousarray(budget // lengths_in_order, dtype=np.int64))
    cuts: list[int] = []
    append = cuts.append
    start = 0
    for end in _segment_ends(n, ends):
        s = start
        while s < end:
            append(s)
            s += caps[s]
        start = end
    return np.asarray(cuts, dtype=np.int64)


def cuts_greedy(lengths_in_order: np.ndarray, budget: int, ends: np.ndarray | None = None) -> np.ndarray:
    """Batch starts for any order, tracking each batch's true longest sample (lengths >= 1)."""
    lens = lengths_in_order.tolist()
    cuts: list[int] = []
    append = cuts.append
    start = 0
    for end in _segment_ends(len(lens), ends):
        if start == end:
            continue
        append(start)
        count = 0
        longest = 0
        for i in range(start, end):
            length = lens[i]
            if length > longest:
                if (count + 1) * length > budget:
                    append(i)
                    count, longest = 1, length
                    continue
                longest = length
            elif (count + 1) * longest > budget:
                append(i)
                count, longest = 1, length
                continue
            count += 1
        start = end
    return np.asarray(cuts, dtype=np.int64)


def batch_max(lengths_in_order: np.ndarray, cuts: np.ndarray) -> np.ndarray:
    """The longest sample of each batch."""
    if len(cuts) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.maximum.reduceat(lengths_in_order, cuts)

