"""The input pipeline: a DataLoader whose item i is this rank's fetched micro-batches of the i-th
step from the data position, read ahead by worker processes and pinned on CUDA.

Item i is a pure function of (position, i) — the epoch's permutation and the cursor — so the
batches consumed are exactly those the sample cursor names, whatever the workers prefetched:
a resume at any world size neither repeats nor skips a sample.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from ddp_trainer.data.batching import BatchShare, Position, position_after
from ddp_trainer.data.sampler import global_order, step_indices
from ddp_trainer.data.workloads import fetch_batch

MicroBatches = list[tuple[Any, Any]]  # (inputs, targets) of each non-empty micro-batch


def resolve_workers(setting: int | None, device_type: str) -> int:
    """`trainer.dataWorkers`: unset means 2 on CUDA and 0 on CPU, where worker processes would
    take the cores the training threads run on."""
    if setting is not None:
        return setting
    return 2 if device_type == "cuda" else 0


class StepBatches(Dataset[MicroBatches]):
    """Item i: this rank's (inputs, targets) of each non-empty micro-batch of the i-th step
    after `start`. Empty micro-batches (a rank's share smaller than its micro-batch count) are
    left out; the last one, whose backward synchronizes gradients, is never empty."""

    def __init__(
        self,
        train_set: Any,
        share: BatchShare,
        seed: int,
        start: Position,
        steps: int,
    ):
        self.train_set = train_set
        self.share = share
        self.seed = seed
        self.start = start
        self.steps = steps
        self.num_samples = len(train_set)
        self._order: tuple[int, torch.Tensor] | None = None  # (epoch, its permutation)

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, index: int) -> MicroBatches:
        if not 0 <= index < self.steps:
            raise IndexError(index)
        here = position_after(self.start, index, self.share.global_batch_size, self.num_samples)
        indices = step_indices(self._epoch_order(here.epoch), self.share, here.samples_in_epoch)
        return [tuple(fetch_batch(self.train_set, part)) for part in indices if len(part)]

    def _epoch_order(self, epoch: int) -> torch.Tensor:
        """The epoch's permutation, computed once per epoch in each process that reads."""
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, global_order(self.num_samples, self.seed, epoch))
        return self._order[1]


def _worker_leaves_process_group(worker_id: int) -> None:
    """A worker stops being a target of the SIGTERM that torchrun sends to the training
    process's group: stopping is the training process's job (it checkpoints, then ends its
    workers). Left in the group, a worker killed by it makes the training process raise
    "DataLoader worker exited unexpectedly" instead of checkpointing."""
    os.setpgid(0, 0)
    signal.sigtimedwait({signal.SIGTERM}, 0)  # one sent to the group while the worker started
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


@contextmanager
def _sigterm_blocked() -> Iterator[None]:
    """SIGTERM waits while workers are forked, so none arrives before a worker has left the
    process group; the training process gets it right after."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def steps_from(
    train_set: Any,
    share: BatchShare,
    seed: int,
    position: Position,
    steps: int,
    device: torch.device,
    workers: int,
    prefetch_steps: int,
) -> Iterator[MicroBatches]:
    """The micro-batches of the next `steps` optimizer steps from `position`, in order.

    Workers are forked (Linux's default: the dataset is shared, not pickled); they only index
    CPU tensors, which is safe after CUDA or the process group started. They end when the
    iterator is dropped (the loop ends, or its frame goes on an exception's way out).
    """
    dataset = StepBatches(train_set, share, seed, position, steps)
    loader = DataLoader(
        dataset,
        batch_size=None,  # each item is already a step's batches
        shuffle=False,
        num_workers=workers,
        pin_memory=device.type == "cuda",  # so that the step's copies to the GPU are async
        prefetch_factor=prefetch_steps if workers else None,
        worker_init_fn=_worker_leaves_process_group if workers else None,
        persistent_workers=False,
    )
    with _sigterm_blocked():
        return iter(loader)
