"""The data order: one global permutation per epoch, consumed `globalBatchSize` samples per step
from a resumable cursor, each rank taking its contiguous share of every step (see
:mod:`ddp_trainer.data.batching`). Resuming at the cursor with any world size therefore neither
repeats nor skips a sample; :class:`ddp_trainer.data.loader.StepBatches` feeds these indices to a
DataLoader."""

from __future__ import annotations

import torch

from ddp_trainer.data.batching import BatchShare


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
