"""The bucket optimizer: exact (matches brute force), never worse than equal-count quantiles."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.batching import optimal_boundaries, padded_cost, quantile_boundaries


def brute_force(lengths, k, cap):
    values = sorted(set(max(1, x) for x in lengths))
    best = None
    for inner in itertools.combinations(values[:-1], min(k, len(values)) - 1):
        cost = padded_cost(np.asarray(lengths), [0, *inner, cap])
        best = cost if best is None else min(best, cost)
    return best


@settings(max_examples=150, deadline=None)
@given(lengths=st.lists(st.integers(0, 40), min_size=1, max_size=30), k=st.integers(1, 6))
def test_matches_brute_force(lengths, k):
    bounds = optimal_boundaries(np.asarray(lengths), k, 40)
    assert bounds[0] == 0 and bounds[-1] == 40 and bounds == sorted(set(bounds))
    assert len(bounds) - 1 <= k
    assert padded_cost(np.asarray(lengths), bounds) == brute_force(lengths, k, 40)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 12), bimodal=st.booleans())
def test_never_worse_than_quantiles(seed, k, bimodal):
    rng = np.random.default_rng(seed)
    n = 2000
    x = rng.lognormal(5.0, 0.8, n)
    if bimodal:
        x = np.where(rng.random(n) < 0.7, x, rng.lognormal(7.5, 0.4, n))
    lengths = np.clip(np.round(x), 1, 8192).astype(np.int64)
    best = padded_cost(lengths, optimal_boundaries(lengths, k, 8192))
    assert best <= padded_cost(lengths, quantile_boundaries(lengths, k, 8192))


def test_more_buckets_never_cost_more():
    lengths = np.clip(np.round(np.random.default_rng(1).lognormal(6.8, 0.72, 20_000)), 1, 8192).astype(np.int64)
    costs = [padded_cost(lengths, optimal_boundaries(lengths, k, 8192)) for k in (1, 2, 4, 8, 16, 32)]
    assert costs == sorted(costs, reverse=True)
    assert costs[0] == len(lengths) * lengths.max()


def test_fewer_distinct_lengths_than_buckets():
    assert optimal_boundaries(np.array([5, 5, 9]), 6, 16) == [0, 5, 16]


def test_errors():
    with pytest.raises(ValueError, match="empty"):
        optimal_boundaries(np.array([], dtype=np.int64), 3, 16)
    with pytest.raises(ValueError, match="max_seq_len"):
        optimal_boundaries(np.array([20]), 3, 16)
    with pytest.raises(ValueError, match=">= 1"):
        optimal_boundaries(np.array([2]), 0, 16)
