"""A DistributedSampler that walks one global permutation per epoch from a resumable cursor."""

from __future__ import annotations

from collections.abc import Iterator, Sized

import torch
from torch.utils.data import DistributedSampler

from .batching import BatchShare


def global_order(num_samples: int, seed: int, epoch: int, shuffle: bool = True) -> torch.Tensor:
    """The permutation of all sample indices that `epoch` walks: a pure function, so that every
    rank and every data-loading worker computes the same one."""
    if not shuffle:
        return torch.arange(num_samples)
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(num_samples, generator=generator)


def step_indices(order: torch.Tensor, share: BatchShare, cursor: int) -> list[torch.Tensor]:
    """This rank's micro-batches of indices of the step whose global batch starts at `cursor` of
    the epoch's `order` (empty ones first, the last never empty)."""
    first = cursor + share.start
    return list(order[first : first + share.count].split(list(share.micro_sizes)))


class GlobalBatchSampler(DistributedSampler):
    """DistributedSampler whose order survives a change of world size.

    Like DistributedSampler, `set_epoch(e)` picks the permutation (seeded by seed + e).
    Unlike it, ranks do not take every world_size-th index: each optimizer step takes the
    next `global_batch_size` indices of the permutation from a cursor (`set_start`), and
    rank r takes its contiguous share of them (see :mod:`ddp_trainer.batching`). Resuming at
    the cursor with any world size therefore neither repeats nor skips a sample.
    """

    def __init__(self, dataset: Sized, share: BatchShare, seed: int, shuffle: bool = True):
        super().__init__(
            dataset,  # type: ignore[arg-type]
            num_replicas=share.world_size,
            rank=share.rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=True,
        )
        self.share = share
        self.start = 0
        self._size = len(dataset)

    def set_start(self, samples_in_epoch: int) -> None:
        """Skip the first `samples_in_epoch` samples of the current epoch's global order."""
        if samples_in_epoch < 0 or samples_in_epoch > self._size:
            raise ValueError(f"cursor {samples_in_epoch} outside dataset of {self._size}")
        self.start = samples_in_epoch

    def global_order(self) -> torch.Tensor:
        """The epoch's permutation of all sample indices, identical on every rank."""
        return global_order(self._size, self.seed, self.epoch, self.shuffle)

    def steps_left(self) -> int:
        return max(0, (self._size - self.start) // self.share.global_batch_size)

    def batches(self) -> Iterator[list[torch.Tensor]]:
        """Per optimizer step: this rank's micro-batches of indices (the last never empty)."""
        order = self.global_order()
        batch = self.share.global_batch_size
        cursor = self.start
        while cursor + batch <= self._size:
            yield step_indices(order, self.share, cursor)
            cursor += batch

    def __iter__(self) -> Iterator[int]:
        for micro_batches in self.batches():
            for indices in micro_batches:
                yield from indices.tolist()

    def __len__(self) -> int:
        return self.steps_left() * self.share.count
