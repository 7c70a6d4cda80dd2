"""The input pipeline: DataLoader items are the steps the sample cursor names, with or without
worker processes, and a resume at another world size neither repeats nor skips a sample."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.utils.data import TensorDataset
from trainer_harness import subprocess_env

from ddp_trainer.data.batching import Position, batch_share, position_after
from ddp_trainer.data.loader import StepBatches, resolve_workers, steps_from
from ddp_trainer.data.sampler import global_order

N, BATCH, SEED = 500, 48, 5  # 10 full batches per epoch, 20 samples dropped
CPU = torch.device("cpu")


def numbered(n: int = N) -> TensorDataset:
    """Samples whose inputs and targets are their own index."""
    return TensorDataset(torch.arange(n), torch.arange(n))


def consumed(world: int, start: Position, steps: int, workers: int = 0) -> list[list[int]]:
    """Per step, the sample indices the whole world trains on, rank by rank."""
    per_step: list[list[int]] = [[] for _ in range(steps)]
    for rank in range(world):
        share = batch_share(BATCH, world, rank, micro_batch_size=10)
        loader = steps_from(numbered(), share, SEED, start, steps, CPU, workers, 2)
        for step, micro_batches in enumerate(loader):
            for inputs, targets in micro_batches:
                assert torch.equal(inputs, targets) and len(inputs) > 0
                per_step[step].extend(inputs.tolist())
    return per_step


def test_items_are_each_ranks_contiguous_share_of_the_next_global_batch_across_epochs() -> None:
    world, start = 3, Position(step=13, epoch=1, samples_in_epoch=3 * BATCH)
    shares = [batch_share(BATCH, world, rank, micro_batch_size=7) for rank in range(world)]
    items = [StepBatches(numbered(), share, SEED, start, steps=20) for share in shares]
    # The oracle: an epoch's permutation cut into global batches of BATCH from the cursor on,
    # the incomplete last one of each epoch dropped.
    expected = []
    for epoch, cursor in [(1, 3 * BATCH), (2, 0), (3, 0)]:
        order = global_order(N, SEED, epoch).tolist()
        expected.extend(order[at : at + BATCH] for at in range(cursor, N - BATCH + 1, BATCH))
    assert all(len(rank_items) == 20 for rank_items in items)
    for index in range(20):
        per_rank = [[inputs.tolist() for inputs, _ in rank_items[index]] for rank_items in items]
        assert all(len(part) <= 7 for parts in per_rank for part in parts), index
        assert [i for parts in per_rank for part in parts for i in part] == expected[index], index


def test_workers_deliver_the_same_steps_in_the_same_order() -> None:
    start = Position(step=4, epoch=0, samples_in_epoch=4 * BATCH)
    assert consumed(2, start, 15, workers=2) == consumed(2, start, 15, workers=0)


@pytest.mark.parametrize(("before", "after"), [(4, 3), (1, 2), (3, 1)])
def test_resume_at_another_world_size_neither_repeats_nor_skips(before: int, after: int) -> None:
    start, stop = Position(0, 0, 0), 7  # the resume is in the middle of the second epoch
    first = consumed(before, start, stop)
    resumed = position_after(start, stop, BATCH, N)
    rest = consumed(after, resumed, 3 * 10 - stop, workers=1)
    steps = first + rest
    for epoch in range(3):
        taken = [index for step in steps[10 * epoch : 10 * epoch + 10] for index in step]
        assert sorted(taken) == sorted(global_order(N, SEED, epoch)[: 10 * BATCH].tolist())
        assert len(set(taken)) == 10 * BATCH


def test_workers_default_to_none_on_cpu() -> None:
    assert resolve_workers(None, "cpu") == 0 and resolve_workers(None, "cuda") == 2
    assert resolve_workers(3, "cpu") == 3


# Reads every step after its process group got SIGTERM, as a trainer that stops later than the
# signal (its ranks agree on a step) does; exits 0 only if no worker died of it. It looks for the
# signal between short sleeps, as the trainer does between steps, not in one long Event.wait: a
# signal the kernel hands to another thread trips Python's flag but wakes no main thread asleep
# in a lock (the likeliest cause of one CI run's miss). If it still sees no signal, it prints
# each thread's blocked and pending signal masks.
READER = textwrap.dedent(
    """
    import os, signal, threading, time, torch
    from torch.utils.data import TensorDataset
    from ddp_trainer.data.batching import Position, batch_share
    from ddp_trainer.data.loader import steps_from

    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stopped.set())
    data = TensorDataset(torch.arange(4800), torch.arange(4800))
    steps = steps_from(data, batch_share(48, 1, 0), 5, Position(0, 0, 0), 100,
                       torch.device("cpu"), 2, 2)
    next(steps)
    print("reading", flush=True)
    deadline = time.monotonic() + 60
    while not stopped.is_set() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not stopped.is_set():
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/status") as status:
                masks = [line.strip() for line in status if line.startswith(("Sig", "Shd"))]
            print("no SIGTERM seen in 60s; thread", task, *masks, flush=True)
        raise SystemExit(1)
    print("read after SIGTERM:", sum(1 for _ in steps), flush=True)
    """
)


def test_data_workers_survive_a_sigterm_to_the_process_group() -> None:
    """torchrun stops a worker with SIGTERM to its process group, which holds the DataLoader
    workers too; they must go on until the trainer is done with them."""
    reader = subprocess.Popen(
        [sys.executable, "-c", READER],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # as torchrun starts its workers
        env=subprocess_env(),  # the sources on its path, however pytest was started
    )
    try:
        assert reader.stdout is not None
        assert reader.stdout.readline().strip() == "reading"
        os.killpg(reader.pid, signal.SIGTERM)
        output, _ = reader.communicate(timeout=120)
    finally:
        reader.kill()
    assert reader.returncode == 0 and "read after SIGTERM: 99" in output, output
