"""Data for the ddp example (numpy only): synthetic token sequences and each rank's batches.

The samples are made from a seed, so every node builds the same ones without reading anything::

    lengths, offsets, tokens = make_data(2000, max_seq_len=128)
    sampler = make_sampler(lengths, config, rank=1, world_size=2)   # orchestrator.batching.BatchSampler
    sampler.set_epoch(0)
    batch = sampler.batches()[0]                                     # sample indices, this rank's share

``orchestrator.batching`` is on the run's PYTHONPATH when orch starts it (the agent ships it); when it is
not importable (this folder copied by hand), ``FallbackSampler`` packs the length-sorted samples greedily
under the token budget, shuffles the batch order per epoch and gives rank r the batches r, r + W, ...
It ignores the strategy, and says so.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

VOCAB = 64
BATCHING_DEFAULTS: dict[str, Any] = {"strategy": "megabatch", "token_budget": 2048, "max_seq_len": 128, "seed": 0}


def make_data(n: int, max_seq_len: int, seed: int = 1234) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fixed-seed samples: lognormal lengths in [4, max_seq_len]; token t+1 = (3 t + 1) mod V, 10% noise.

    Returns (lengths, offsets, tokens): sample i is ``tokens[offsets[i]:offsets[i] + lengths[i]]``.
    """
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(32), 0.7, n).astype(np.int64), 4, max_seq_len)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    tokens = np.empty(int(lengths.sum()), dtype=np.int64)
    tokens[offsets] = rng.integers(0, VOCAB, n)
    for p in range(1, int(lengths.max())):
        at = offsets[lengths > p] + p
        nxt = (3 * tokens[at - 1] + 1) % VOCAB
        noise = rng.random(len(at)) < 0.1
        nxt[noise] = rng.integers(0, VOCAB, int(noise.sum()))
        tokens[at] = nxt
    return lengths, offsets, tokens


def padded(idx: np.ndarray, lengths: np.ndarray, offsets: np.ndarray,
           tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inputs, targets and mask as dense ``(n, max_len - 1)`` arrays (pads repeat a sample's last token)."""
    lens = lengths[idx]
    width = int(lens.max()) - 1
    pos = np.arange(width + 1)
    seq = tokens[offsets[idx][:, None] + np.minimum(pos[None, :], lens[:, None] - 1)]
    mask = (pos[None, :width] < (lens[:, None] - 1)).astype(np.float32)
    return seq[:, :-1], seq[:, 1:], mask


def read_batching(path: str | None) -> dict[str, Any]:
    """The ``[batching]`` table orch hands the run (``ORCH_BATCHING_FILE``) over the defaults above."""
    config = dict(BATCHING_DEFAULTS)
    if path:
        config.update({k: v for k, v in json.loads(Path(path).read_text()).items() if v is not None})
    return config


class FallbackSampler:
    """Stand-in for ``orchestrator.batching.BatchSampler`` (same ``batches``/``set_epoch``/``len``)."""

    def __init__(self, lengths: np.ndarray, config: dict[str, Any], *, rank: int = 0, world_size: int = 1) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
        self.lengths, self.config = lengths, dict(config)
        self.rank, self.world_size, self.epoch = rank, world_size, 0
        self._batches: list[np.ndarray] | None = None

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self._batches = epoch, None

    def batches(self) -> list[np.ndarray]:
        if self._batches is None:
            every = self._pack()
            usable = len(every) - len(every) % self.world_size  # every rank takes as many steps
            self._batches = every[self.rank:usable:self.world_size]
        return self._batches

    def _pack(self) -> list[np.ndarray]:
        budget = int(self.config["token_budget"])
        batches: list[list[int]] = []
        current: list[int] = []
        longest = 0
        for i in np.argsort(self.lengths, kind="stable").tolist():
            length = int(self.lengths[i])
            if current and (len(current) + 1) * max(longest, length) > budget:
                batches.append(current)
                current, longest = [], 0
            current.append(i)
            longest = max(longest, length)
        if current:
            batches.append(current)
        order = np.random.default_rng([int(self.config["seed"]), self.epoch]).permutation(len(batches))
        return [np.asarray(batches[k], dtype=np.int64) for k in order]

    def __len__(self) -> int:
        return len(self.batches())


def make_sampler(lengths: np.ndarray, config: dict[str, Any], *, rank: int, world_size: int, quiet: bool = False):
    """orch's ``BatchSampler`` when importable, else ``FallbackSampler`` (said once on stderr unless ``quiet``)."""
    try:
        from orchestrator.batching import BatchSampler
    except ImportError:
        if not quiet:
            print("orchestrator.batching is not importable: using the built-in sorted fallback "
                  f"(strategy {config.get('strategy')!r} ignored)", file=sys.stderr, flush=True)
        return FallbackSampler(lengths, config, rank=rank, world_size=world_size)
    return BatchSampler(lengths, config, rank=rank, world_size=world_size)
