"""Every strategy against plain-Python reference builds: same batches, within budget, each sample once."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.batching import build_batches, normalize
from orchestrator.batching.pack import cuts_descending, cuts_greedy
from orchestrator.batching.strategies import BUILDERS, batch_order, bucket_of, prepare


def reference_pack(lengths: list[int], budget: int) -> list[list[int]]:
    """Greedy in the given order: close the batch when one more sample would exceed the budget."""
    batches, current, longest = [], [], 0
    for position, length in enumerate(lengths):
        if current and (len(current) + 1) * max(longest, length) > budget:
            batches.append(current)
            current, longest = [], 0
        current.append(position)
        longest = max(longest, length)
    if current:
        batches.append(current)
    return batches


def reference_batches(length: list[int], cfg: dict, rng) -> list[list[int]]:
    """The strategies written out in plain Python (the randomness drawn exactly as the library does)."""
    budget, n = cfg["token_budget"], len(length)
    strategy = cfg["strategy"]
    if strategy == "sorted":
        groups = [sorted(range(n), key=lambda i: (-length[i], i))]
    elif strategy == "shuffle":
        groups = [[int(i) for i in rng.permutation(n)]]
    elif strategy == "bucketed":
        perm = [int(i) for i in rng.permutation(n)]
        bounds = cfg["buckets"]
        groups = [[i for i in perm if bounds[k] < length[i] <= bounds[k + 1]] for k in range(len(bounds) - 1)]
    else:
        perm = [int(i) for i in rng.permutation(n)]
        chunk_tokens = cfg["megabatch"] * budget
        groups, seen = {}, 0
        for position, i in enumerate(perm):
            groups.setdefault(seen // chunk_tokens, []).append((position, i))
            seen += length[i]
        groups = [[i for _, i in sorted(g, key=lambda pi: (-length[pi[1]], pi[0]))] for _, g in sorted(groups.items())]
    out = []
    for group in groups:
        out += [[group[p] for p in batch] for batch in reference_pack([length[i] for i in group], budget)]
    return out


lengths_st = st.lists(st.integers(1, 64), min_size=0, max_size=120)


@settings(max_examples=60, deadline=None)
@given(lengths=lengths_st, budget=st.integers(64, 300), data=st.data())
def test_packers_match_reference(lengths, budget, data):
    arr = np.asarray(lengths, dtype=np.int64)
    ends = sorted(set(data.draw(st.lists(st.integers(0, len(lengths)), max_size=4))) | {len(lengths)})
    expected, start = [], 0
    for end in ends:
        expected += [start + b[0] for b in reference_pack(lengths[start:end], budget)]
        start = end
    assert cuts_greedy(arr, budget, np.asarray(ends)).tolist() == expected
    desc = []
    start = 0
    for end in ends:
        desc += sorted(lengths[start:end], reverse=True)
        start = end
    expected, start = [], 0
    for end in ends:
        expected += [start + b[0] for b in reference_pack(desc[start:end], budget)]
        start = end
    assert cuts_descending(np.asarray(desc, dtype=np.int64), budget, np.asarray(ends)).tolist() == expected


@pytest.mark.parametrize("strategy", ["sorted", "shuffle", "bucketed", "megabatch"])
@settings(max_examples=40, deadline=None)
@given(lengths=lengths_st, budget=st.integers(64, 400), seed=st.integers(0, 2**32), megabatch=st.integers(1, 5))
def test_strategies_match_reference(strategy, lengths, budget, seed, megabatch):
    cfg = normalize({"strategy": strategy, "token_budget": budget, "max_seq_len": 64, "megabatch": megabatch,
                     "buckets": [0, 8, 20, 64], "seed": seed})
    arr = np.asarray(lengths, dtype=np.int64)
    order, cuts = BUILDERS[strategy](arr, cfg, np.random.default_rng([seed, 3]))
    got = [b.tolist() for b in np.split(order, cuts[1:])] if len(cuts) else []
    assert got == reference_batches(lengths, cfg, np.random.default_rng([seed, 3]))


@pytest.mark.parametrize("strategy", ["sorted", "shuffle", "bucketed", "megabatch"])
@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(0, 80), max_size=150), budget=st.integers(64, 500), window=st.integers(1, 9),
       policy=st.sampled_from(["truncate", "drop"]), epoch=st.integers(0, 5))
def test_epoch_within_budget_and_each_sample_once(strategy, lengths, budget, window, policy, epoch):
    cfg = {"strategy": strategy, "token_budget": budget, "max_seq_len": 64, "window": window, "overlong": policy}
    batches = build_batches(lengths, cfg, epoch=epoch)
    seen = np.concatenate(batches).tolist() if batches else []
    over = [i for i, x in enumerate(lengths) if x > 64]
    expected = [i for i in range(len(lengths)) if policy == "truncate" or i not in over]
    assert sorted(seen) == expected
    for b in batches:
        assert len(b) >= 1
        assert len(b) * min(64, max(1, max(lengths[i] for i in b))) <= budget
    assert build_batches(lengths, cfg, epoch=epoch) is not batches
    assert [b.tolist() for b in build_batches(lengths, cfg, epoch=epoch)] == [b.tolist() for b in batches]


def _lognormal(n, seed=0):
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(6.8, 0.72, n)), 1, 8192).astype(np.int64)


@pytest.mark.parametrize("strategy", ["sorted", "shuffle", "bucketed", "megabatch"])
def test_deterministic_per_seed_and_epoch(strategy):
    lengths = _lognormal(3000)
    cfg = {"strategy": strategy, "megabatch": 4, "buckets": [0, 700, 1500, 8192]}
    first = [b.tolist() for b in build_batches(lengths, cfg, epoch=1)]
    assert first == [b.tolist() for b in build_batches(lengths, cfg, epoch=1)]
    assert first != [b.tolist() for b in build_batches(lengths, cfg, epoch=2)]
    assert first != [b.tolist() for b in build_batches(lengths, {**cfg, "seed": 7}, epoch=1)]
    compositions = {tuple(sorted(b)) for b in first}
    other = {tuple(sorted(b.tolist())) for b in build_batches(lengths, cfg, epoch=2)}
    if strategy == "sorted":
        assert compositions == other  # recipe (a): only the order changes
    else:
        assert len(compositions & other) < len(compositions) / 2


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 400), world=st.integers(1, 8), epoch=st.integers(0, 3))
def test_rank_shares_are_disjoint_equal_and_cover_the_trimmed_list(n, world, epoch):
    lengths = _lognormal(n, seed=n)
    cfg = {"megabatch": 2, "token_budget": 16384}
    full = build_batches(lengths, cfg, epoch=epoch)
    shares = [build_batches(lengths, cfg, epoch=epoch, rank=r, world_size=world) for r in range(world)]
    assert len({len(s) for s in shares}) == 1
    assert len(shares[0]) == len(full) // world
    flat = [i for s in shares for b in s for i in b.tolist()]
    assert len(flat) == len(set(flat))
    usable = len(full) - len(full) % world
    assert sorted(flat) == sorted(i for b in full[:usable] for i in b.tolist())


def test_bad_rank_is_an_error():
    with pytest.raises(ValueError, match="rank"):
        build_batches([1, 2], {}, rank=2, world_size=2)


@settings(max_examples=60, deadline=None)
@given(longest=st.lists(st.integers(1, 50), min_size=0, max_size=90), window=st.integers(2, 9), seed=st.integers(0, 99))
def test_stratified_order_puts_one_batch_of_each_stratum_in_every_window(longest, window, seed):
    longest = np.asarray(longest, dtype=np.int64)
    order = batch_order(longest, window, np.random.default_rng(seed))
    assert sorted(order.tolist()) == list(range(len(longest)))
    per = len(longest) // window
    if per == 0:
        return
    main = np.sort(longest[order[: per * window]]).reshape(window, per)  # strata by value
    for w in range(per):
        values = np.sort(longest[order[w * window:(w + 1) * window]])
        assert all(main[s, 0] <= values[s] <= main[s, -1] for s in range(window))


def test_bucket_of_follows_upper_inclusive_boundaries():
    assert bucket_of(np.array([1, 8, 9, 20, 21, 64]), [0, 8, 20, 64]).tolist() == [0, 0, 1, 1, 2, 2]


def test_overlong_policies():
    lengths = [10, 100, 20, 300]
    with pytest.raises(ValueError, match="2 of 4 samples are longer than max_seq_len=64"):
        build_batches(lengths, {"max_seq_len": 64, "token_budget": 128})
    prepared = prepare(lengths, normalize({"max_seq_len": 64, "token_budget": 128, "overlong": "truncate"}))
    assert prepared.length.tolist() == [10, 64, 20, 64] and prepared.overlong["truncated"] == 2
    prepared = prepare(lengths, normalize({"max_seq_len": 64, "token_budget": 128, "overlong": "drop"}))
    assert prepared.index.tolist() == [0, 2] and prepared.overlong["dropped"] == 2


@pytest.mark.parametrize("bad", [[-1, 2], [1.5, 2], [[1, 2]], ["a"]])
def test_bad_lengths_are_value_errors(bad):
    with pytest.raises(ValueError, match="lengths"):
        build_batches(bad, {})
