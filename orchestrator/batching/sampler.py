"""A batch sampler for training loops: PyTorch's ``batch_sampler=`` or a plain ``for`` loop.

    sampler = BatchSampler(lengths, config, rank=rank, world_size=world_size)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=pad_collate)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader: ...

It needs no torch: it only has ``__iter__`` (lists of ints), ``__len__`` and ``set_epoch``.
"""

from __future__ import annotations

import numpy as np

from .build import complete
from .config import normalize
from .strategies import build_epoch, check_rank, prepare, shard


class BatchSampler:
    """Yields this rank's batches of one epoch; the data-dependent choices are made once, here."""

    def __init__(self, lengths, config=None, *, rank: int = 0, world_size: int = 1, epoch: int = 0) -> None:
        check_rank(rank, world_size)
        cfg = normalize(config)
        self._prepared = prepare(lengths, cfg)
        #: the explicit config (chosen buckets / megabatch size filled in): record it with the run
        self.config = complete(self._prepared, cfg)
        self.rank = rank
        self.world_size = world_size
        self.epoch = epoch
        self._batches: list[np.ndarray] | None = None

    @property
    def overlong(self) -> dict:
        """Counts of samples over max_seq_len and what the policy did with them."""
        return dict(self._prepared.overlong)

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch = epoch
            self._batches = None

    def batches(self) -> list[np.ndarray]:
        """This rank's batches of the current epoch as index arrays (built once per epoch)."""
        if self._batches is None:
            self._batches = shard(build_epoch(self._prepared, self.config, self.epoch), self.rank, self.world_size)
        return self._batches

    def __iter__(self):
        for batch in self.batches():
            yield batch.tolist()

    def __len__(self) -> int:
        return len(self.batches())
