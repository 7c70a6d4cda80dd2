"""Pure arithmetic of the data position: global batches, per-rank shares, micro-batches.

Every optimizer step consumes exactly `global_batch_size` samples of the epoch's global
permutation, starting at a cursor. Rank r takes a contiguous share of that global batch,
so a resume at any world size continues at the cursor: no sample repeated or skipped.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Position:
    """Where training stands: `step` optimizer steps done in total, inside `epoch`."""

    step: int
    epoch: int
    samples_in_epoch: int


@dataclass(frozen=True)
class BatchShare:
    """One process's share of every global batch, and how it runs it in micro-batches."""

    global_batch_size: int
    world_size: int
    rank: int
    start: int  # offset of this rank's share inside the global batch
    count: int  # samples of this rank per optimizer step
    micro_sizes: tuple[int, ...]  # forward/backward passes; the last one syncs gradients

    @property
    def accumulation_steps(self) -> int:
        return len(self.micro_sizes)


def steps_per_epoch(num_samples: int, global_batch_size: int) -> int:
    """Full global batches in one epoch (an incomplete last batch is dropped)."""
    return num_samples // global_batch_size


def rank_share(global_batch_size: int, world_size: int, rank: int) -> tuple[int, int]:
    """(start, count) of `rank`'s contiguous share; shares differ by at most one sample."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world size {world_size}")
    if global_batch_size < world_size:
        raise ValueError(
            f"globalBatchSize ({global_batch_size}) must be at least the world size "
            f"({world_size}): every process needs a sample per step"
        )
    base, extra = divmod(global_batch_size, world_size)
    start = rank * base + min(rank, extra)
    return start, base + (1 if rank < extra else 0)


def largest_share(global_batch_size: int, world_size: int) -> int:
    """The per-rank batch of the ranks with the most samples."""
    return -(-global_batch_size // world_size)


def micro_batch_cap(micro_batch_size: int | None, run_cap: int) -> int:
    """The largest micro-batch of a step: microBatchSize when set, else the run's cap (the
    largest per-rank batch of its first start, saved in its checkpoints: see
    :class:`ddp_trainer.state.train_state.TrainState`). So shrinking the world adds micro-batches
    instead of growing the per-rank batch past what the run has shown it can hold."""
    return run_cap if micro_batch_size is None else micro_batch_size


def accumulation_steps(
    global_batch_size: int, world_size: int, micro_batch_size: int | None
) -> int:
    """Micro-batches per optimizer step, the same on every rank."""
    if micro_batch_size is None:
        return 1
    return -(-largest_share(global_batch_size, world_size) // micro_batch_size)


def micro_sizes(count: int, accumulation: int) -> tuple[int, ...]:
    """Split `count` samples into `accumulation` near-equal parts, empty ones first.

    Empty parts come first so the last part, whose backward synchronizes gradients,
    is never empty.
    """
    if count < 1 or accumulation < 1:
        raise ValueError(f"need count >= 1 and accumulation >= 1, got {count}, {accumulation}")
    base, extra = divmod(count, accumulation)
    sizes = [base + (1 if i < extra else 0) for i in range(accumulation)]
    return tuple(sorted(sizes))


def batch_share(
    global_batch_size: int, world_size: int, rank: int, micro_batch_size: int | None = None
) -> BatchShare:
    """This rank's share of every global batch and its micro-batches."""
    start, count = rank_share(global_batch_size, world_size, rank)
    accumulation = accumulation_steps(global_batch_size, world_size, micro_batch_size)
    return BatchShare(
        global_batch_size=global_batch_size,
        world_size=world_size,
        rank=rank,
        start=start,
        count=count,
        micro_sizes=micro_sizes(count, accumulation),
    )


def total_steps(epochs: int, per_epoch: int, max_steps: int | None) -> int:
    """Optimizer steps of the whole run."""
    steps = epochs * per_epoch
    return steps if max_steps is None else min(steps, max_steps)


def advance(position: Position, global_batch_size: int, num_samples: int) -> Position:
    """The position after one more optimizer step (an epoch ends when no full batch is left)."""
    consumed = position.samples_in_epoch + global_batch_size
    return settle(
        Position(step=position.step + 1, epoch=position.epoch, samples_in_epoch=consumed),
        global_batch_size,
        num_samples,
    )


def settle(position: Position, global_batch_size: int, num_samples: int) -> Position:
    """Move to the next epoch's start when the rest of this epoch holds no full batch."""
    if position.samples_in_epoch + global_batch_size > num_samples:
        return Position(step=position.step, epoch=position.epoch + 1, samples_in_epoch=0)
    return position


def position_after(
    position: Position, steps: int, global_batch_size: int, num_samples: int
) -> Position:
    """The position `steps` optimizer steps later: `advance` applied `steps` times, in one go
    (a data-loading worker finds the data of any later step without walking to it)."""
    here = settle(position, global_batch_size, num_samples)
    left_in_epoch = (num_samples - here.samples_in_epoch) // global_batch_size
    if steps < left_in_epoch:
        cursor = here.samples_in_epoch + steps * global_batch_size
        return Position(step=here.step + steps, epoch=here.epoch, samples_in_epoch=cursor)
    epochs, rest = divmod(steps - left_in_epoch, steps_per_epoch(num_samples, global_batch_size))
    return Position(
        step=here.step + steps,
        epoch=here.epoch + 1 + epochs,
        samples_in_epoch=rest * global_batch_size,
    )


def step_seed(seed: int, step: int, rank: int) -> int:
    """Seed of the RNG for one step on one rank: dropout then depends on nothing else."""
    return ((seed * 1_000_003 + step) * 65_537 + rank) % (2**63 - 1)
