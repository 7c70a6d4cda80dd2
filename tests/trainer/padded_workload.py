"""Test plugins: `padded_workload:build`, a tiny next-token model on sequences padded with -100 in
varying amounts (token-weighted loss); `padded_workload:nan_at_steps`, the spirals plugin whose
loss is NaN at the steps in env ``NAN_STEPS`` on the ranks in ``NAN_RANKS``;
`padded_workload:nan_while_flagged`, the spirals plugin whose loss is NaN while the file
``NAN_FLAG`` exists; `padded_workload:hang_at_step`, the spirals plugin whose loss never returns
at step ``HANG_STEP`` on the ranks in ``HANG_RANKS`` (the others wait for them in the step's
collectives); `padded_workload:wait_in_evaluation`, the spirals plugin whose evaluation writes
its pid to ``EVAL_MARKER`` and waits until the file ``EVAL_RELEASE`` exists;
`padded_workload:wait_in_build`, the spirals plugin that, on the first process of rank
``BUILD_RANK`` to build it in a world of ``BUILD_WORLD_SIZE``, writes that process's pid to
``BUILD_MARKER`` and waits forever (the test freezes or kills it there: its peers wait for it at
the run's start)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from plugin_workload import build as spirals
from torch import nn
from torch.utils.data import TensorDataset

from ddp_trainer.data.workloads import IGNORE_INDEX, Workload, count_not_ignored

VOCAB, LENGTH = 32, 16


def six_steps(workload: str, **settings: Any) -> dict[str, Any]:
    """Trainer settings for six steps of ``workload`` (a plugin of this folder) on the CPU, each
    step logged, no checkpoint before the final one; ``settings`` add to them."""
    return {
        "workload": workload,
        "epochs": 1,
        "maxSteps": 6,
        "globalBatchSize": 50,
        "amp": "off",
        "checkpointEverySteps": 0,
        "logEverySteps": 1,
        "device": "cpu",
        **settings,
    }


def build(config) -> Workload:
    generator = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, VOCAB, (64, LENGTH + 1), generator=generator)
    inputs, targets = tokens[:, :-1].clone(), tokens[:, 1:].clone()
    # From 1 to LENGTH real targets per sample, the rest padding: micro-batches differ a lot.
    real = torch.randint(1, LENGTH + 1, (64,), generator=generator)
    targets[torch.arange(LENGTH) >= real.unsqueeze(1)] = IGNORE_INDEX
    model = nn.Sequential(nn.Embedding(VOCAB, 16), nn.Tanh(), nn.Linear(16, VOCAB))

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(
            logits.reshape(-1, VOCAB), targets.reshape(-1), ignore_index=IGNORE_INDEX
        )

    return Workload(
        model, TensorDataset(inputs, targets), None, loss_fn, count_targets=count_not_ignored
    )


def nan_at_steps(config) -> Workload:
    """One micro-batch per step and no evaluation: the n-th loss computed is step n's."""
    workload = spirals(config)
    steps = {int(s) for s in os.environ.get("NAN_STEPS", "").split(",") if s}
    ranks = {int(r) for r in os.environ.get("NAN_RANKS", "0").split(",") if r}
    poisoned = int(os.environ.get("RANK", "0")) in ranks
    calls = [0]

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        loss = F.cross_entropy(outputs, targets)
        return loss * float("nan") if poisoned and calls[0] in steps else loss

    return Workload(workload.model, workload.train_set, workload.test_set, loss_fn)


def nan_while_flagged(config) -> Workload:
    """Every loss NaN while the file ``NAN_FLAG`` exists (looked for at each loss)."""
    workload = spirals(config)
    flag = Path(os.environ["NAN_FLAG"])

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(outputs, targets)
        return loss * float("nan") if flag.exists() else loss

    return Workload(workload.model, workload.train_set, workload.test_set, loss_fn)


def hang_at_step(config) -> Workload:
    """One micro-batch per step and no evaluation: the n-th loss computed is step n's."""
    workload = spirals(config)
    step = int(os.environ.get("HANG_STEP", "0"))
    ranks = {int(r) for r in os.environ.get("HANG_RANKS", "0").split(",") if r}
    hangs = int(os.environ.get("RANK", "0")) in ranks
    calls = [0]

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        if hangs and calls[0] == step:
            threading.Event().wait()  # a deadlock of the user's code: nothing ends it
        return F.cross_entropy(outputs, targets)

    return Workload(workload.model, workload.train_set, workload.test_set, loss_fn)


def wait_in_evaluation(config) -> Workload:
    """The evaluation's first loss (no gradients: only evaluation computes one so) announces
    this process and waits for the test's release."""
    workload = spirals(config)
    marker, released = Path(os.environ["EVAL_MARKER"]), Path(os.environ["EVAL_RELEASE"])

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled() and not released.exists():
            marker.write_text(str(os.getpid()))
            while not released.exists():
                time.sleep(0.05)
        return F.cross_entropy(outputs, targets)

    return Workload(workload.model, workload.train_set, workload.test_set, loss_fn)


def wait_in_build(config) -> Workload:
    """The first process of rank ``BUILD_RANK`` to build the workload in a world of
    ``BUILD_WORLD_SIZE`` processes claims ``BUILD_MARKER`` (its pid) and never returns: every
    other process builds it as the spirals plugin does. Until it is claimed, a smaller world (a
    rendezvous round that closed before every node joined: a slow start) waits too, until
    torchrun replaces that round with the full one; a smaller world after the claim (the
    survivors of the lost node) builds and trains."""
    marker = Path(os.environ["BUILD_MARKER"])
    if int(os.environ["WORLD_SIZE"]) < int(os.environ["BUILD_WORLD_SIZE"]) and not marker.exists():
        threading.Event().wait()
    if os.environ.get("RANK") == os.environ["BUILD_RANK"]:
        try:
            with open(marker, "x") as claim:
                claim.write(str(os.getpid()))
        except FileExistsError:
            return spirals(config)  # a later process of that rank: the run goes on
        threading.Event().wait()
    return spirals(config)
