"""What a batching produces, measured (definitions in the project's BATCHING.md).

- efficiency: real tokens / sum over batches of ``n * max_len`` (padding efficiency);
- budget_fill: real tokens / (batches * token_budget);
- d1: of all pairs of samples sharing a batch in epoch e, the fraction sharing one again in e+1;
- d2: Kolmogorov-Smirnov distance between the token-weighted length distribution of each window
  of ``window`` consecutive batches and the whole epoch's, averaged over windows;
- s_and_l: the share of windows holding a short sample (F(l-1) < 0.25) and a long one (F(l) > 0.75),
  F being the token-weighted CDF of lengths.

Windows are the ``len(batches) // window`` full windows (one partial window if there is no full one).
"""

from __future__ import annotations

import numpy as np


def _flatten(batches) -> tuple[np.ndarray, np.ndarray]:
    sizes = np.fromiter((len(b) for b in batches), dtype=np.int64, count=len(batches))
    flat = np.concatenate([np.asarray(b, dtype=np.int64) for b in batches]) if len(batches) else np.zeros(0, np.int64)
    return flat, sizes


def co_batch_recurrence(n_samples: int, batches0, batches1) -> float:
    """D1: the share of epoch-0 co-batched pairs that are co-batched again in epoch 1."""
    flat0, sizes0 = _flatten(batches0)
    flat1, sizes1 = _flatten(batches1)
    pairs0 = float((sizes0 * (sizes0 - 1) // 2).sum())
    if pairs0 == 0:
        return 0.0
    b1 = np.full(n_samples, -1, dtype=np.int64)
    b1[flat1] = np.repeat(np.arange(len(sizes1)), sizes1)
    b0 = np.repeat(np.arange(len(sizes0)), sizes0)
    other = b1[flat0]
    keep = other >= 0
    key = b0[keep] * max(len(sizes1), 1) + other[keep]
    _, counts = np.unique(key, return_counts=True)
    return float((counts * (counts - 1) // 2).sum()) / pairs0


def token_cdf(lengths: np.ndarray) -> np.ndarray:
    """``F[l]``: share of all tokens in samples of length <= l, for l = 0..max."""
    hist = np.bincount(lengths, weights=lengths.astype(np.float64))
    total = hist.sum()
    return np.cumsum(hist) / total if total > 0 else np.ones_like(hist)


def window_mixing(lengths: np.ndarray, batches, window: int) -> tuple[float, float, int]:
    """(D2, S&L, number of windows) over windows of ``window`` consecutive batches."""
    flat, sizes = _flatten(batches)
    if len(flat) == 0:
        return 0.0, 0.0, 0
    lens = lengths[flat]
    cdf = token_cdf(lens)
    cdf_before = np.concatenate(([0.0], cdf[:-1]))  # F(l - 1)
    n_windows = max(len(sizes) // window, 1)
    win = np.repeat(np.arange(len(sizes)) // window, sizes)
    inside = win < n_windows
    lens, win = lens[inside], win[inside]

    short = cdf_before[lens] < 0.25
    long_ = cdf[lens] > 0.75
    has_short = np.bincount(win, weights=short, minlength=n_windows) > 0
    has_long = np.bincount(win, weights=long_, minlength=n_windows) > 0
    s_and_l = float(np.mean(has_short & has_long))

    # KS distance per window: both CDFs are step functions, so the supremum is reached at a window
    # length (after its run of equal lengths) or just before one (before the run).
    # Sort by (window, length) as one packed key; lengths are the weights, so nothing else moves.
    span = int(lens.max()) + 1
    key = win.astype(np.int64) * span + lens
    key.sort()
    win, lens = np.divmod(key, span)
    weight = lens.astype(np.float64)
    cum = np.cumsum(weight)
    starts = np.flatnonzero(np.r_[True, win[1:] != win[:-1]])
    base = np.repeat(cum[starts] - weight[starts], np.diff(np.r_[starts, len(win)]))
    total = np.repeat(np.add.reduceat(weight, starts), np.diff(np.r_[starts, len(win)]))
    incl = (cum - base) / total
    excl = (cum - weight - base) / total
    new_run = np.r_[True, (lens[1:] != lens[:-1]) | (win[1:] != win[:-1])]
    end_run = np.r_[new_run[1:], True]
    gap = np.zeros(len(lens))
    gap[end_run] = np.abs(incl[end_run] - cdf[lens[end_run]])
    before = np.abs(excl - cdf_before[lens])
    gap[new_run] = np.maximum(gap[new_run], before[new_run])
    d2 = float(np.mean(np.maximum.reduceat(gap, starts)))
    return d2, s_and_l, n_windows


def metrics(lengths, batches_epoch0, batches_epoch1, token_budget: int, window: int, *,
            max_seq_len: int | None = None, sorted_efficiency: float | None = None) -> dict:
    """Efficiency, budget fill, batch count, D1, D2 and S&L of two consecutive epochs' batches.

    ``lengths`` are the dataset's lengths (clipped to ``max_seq_len`` when given, as truncation
    does); ``sorted_efficiency`` (sorted-greedy's efficiency on the same data) adds
    ``efficiency_vs_sorted``.
    """
    lens = np.maximum(np.asarray(lengths, dtype=np.int64), 1)
    if max_seq_len is not None:
        lens = np.minimum(lens, max_seq_len)
    real = 0
    padded = 0
    over = 0
    flat, sizes = _flatten(batches_epoch0)
    if len(flat):
        per = lens[flat]
        starts = np.r_[0, np.cumsum(sizes)[:-1]]
        nonempty = sizes > 0
        longest = np.maximum.reduceat(per, starts[nonempty])
        cost = sizes[nonempty] * longest
        real = int(per.sum())
        padded = int(cost.sum())
        over = int((cost > token_budget).sum())
    d2, s_and_l, n_windows = window_mixing(lens, batches_epoch0, window)
    out = {
        "efficiency": real / padded if padded else 0.0,
        "budget_fill": real / (len(sizes) * token_budget) if len(sizes) else 0.0,
        "batches": len(sizes),
        "samples": int(len(flat)),
        "real_tokens": real,
        "padded_tokens": padded,
        "over_budget": over,
        "d1": co_batch_recurrence(len(lens), batches_epoch0, batches_epoch1),
        "d2": d2,
        "s_and_l": s_and_l,
        "windows": n_windows,
        "window": window,
    }
    if sorted_efficiency:
        out["efficiency_vs_sorted"] = out["efficiency"] / sorted_efficiency
    return out
