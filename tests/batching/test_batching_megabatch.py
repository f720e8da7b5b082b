"""Choosing M: the smallest megabatch size that keeps the target share of sorted-greedy's efficiency."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.batching import build_batches, normalize, resolve
from orchestrator.batching.megabatch import choose_megabatch, reaches, smallest, sorted_efficiency


@given(hi=st.integers(1, 5000), data=st.data())
def test_smallest_finds_the_first_true_of_a_monotone_predicate(hi, data):
    first = data.draw(st.integers(1, hi + 1))  # hi + 1: never true
    calls = []

    def ok(m):
        calls.append(m)
        return m >= first

    assert smallest(ok, hi) == min(first, hi)
    assert len(calls) <= 2 * hi.bit_length() + 2


def test_chosen_m_is_the_smallest_reaching_the_target():
    lengths = np.clip(np.round(np.random.default_rng(5).lognormal(6.0, 0.9, 30_000)), 1, 4096).astype(np.int64)
    cfg = normalize({"token_budget": 16384, "max_seq_len": 4096})
    goal = cfg["target_efficiency"] * sorted_efficiency(lengths, cfg)
    m = choose_megabatch(lengths, cfg)
    assert reaches(lengths, cfg, m, goal)
    assert m == 1 or not reaches(lengths, cfg, m - 1, goal)
    # and it holds on seeds the search never saw
    for seed in range(3):
        planned = resolve(lengths, {**cfg, "seed": seed})["planned"]
        assert planned["efficiency_vs_sorted"] >= cfg["target_efficiency"]
    # a looser target allows smaller megabatches, hence fresher batches
    assert choose_megabatch(lengths, {**cfg, "target_efficiency": 0.95}) < m


def test_tiny_dataset_can_fall_back_to_one_megabatch():
    lengths = [7, 300, 5, 250, 9, 4000]
    m = resolve(lengths, {"token_budget": 4096, "max_seq_len": 4096, "target_efficiency": 1.0})["config"]["megabatch"]
    batches = build_batches(lengths, {"token_budget": 4096, "max_seq_len": 4096, "megabatch": m})
    assert sorted(i for b in batches for i in b.tolist()) == list(range(6))
