"""Building a run: from its settings and the process's place in the group to the parts the
training loop uses (model, optimizer, precision, batches, state), and fitting its batches and DDP
to the run once its checkpoint is loaded. No training happens here."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from ddp_api.trainer_config import TrainerConfig
from ddp_trainer.amp import Precision, resolve_amp
from ddp_trainer.data.batching import (
    BatchShare,
    batch_share,
    micro_batch_cap,
    steps_per_epoch,
    total_steps,
)
from ddp_trainer.data.loader import resolve_workers
from ddp_trainer.data.workloads import build_workload
from ddp_trainer.schedule import peak_lr
from ddp_trainer.state.train_state import AT_TOP, Stateful, TrainState, seed_rngs

log = logging.getLogger("ddp_trainer.trainer")  # the trainer's lines: people and tests grep them


@dataclass
class Parts:
    """Everything one process trains with; the Stateful ones go into every checkpoint."""

    device: torch.device
    model: torch.nn.Module  # the plain module: checkpoints hold its weights without `module.`
    net: torch.nn.Module  # what the forward runs: the model, or DDP around it, maybe compiled
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    precision: Precision
    train_set: Any
    test_set: Any
    loss_fn: Any
    count_targets: Any  # loss terms of a batch's targets; None: weight the loss by samples
    batches: BatchShare  # this rank's share of each global batch (final after fit_to_run)
    data_workers: int  # DataLoader worker processes of this process (trainer.dataWorkers)
    per_epoch: int
    total_steps: int
    peak_lr: float
    state: TrainState

    def stateful(self) -> dict[str, Stateful]:
        """The checkpoint's parts by their key (TrainState's keys are spread at the top)."""
        return {
            "model": self.model,
            "optimizer": self.optimizer,
            "scaler": self.scaler,
            AT_TOP: self.state,
        }


def pick_device(setting: str, local_rank: int) -> torch.device:
    if setting == "cuda" or (setting == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("device: cuda was asked for but CUDA is not available")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def bf16_native(device: torch.device) -> bool:
    """Whether ``device`` computes in bf16 natively: CPUs do; CUDA devices from compute
    capability 8.0 (Ampere) on. Emulated bf16 (V100, T4) counts as no: fp16 is faster there."""
    if device.type == "cpu":
        return True
    return bool(torch.cuda.is_bf16_supported(including_emulation=False))


def use_static_graph(requested: bool, share: BatchShare) -> bool:
    """DDP's static_graph where it is asked for and each step runs one micro-batch: with more
    (gradients accumulated under no_sync) its first backward fails (pytorch/pytorch#143580).
    The same on every rank: accumulation_steps is."""
    return requested and share.accumulation_steps == 1


def compiled(net: torch.nn.Module) -> torch.nn.Module:
    """`torch.compile` of what the forward runs. Around DDP, as PyTorch's DDP notes advise:
    its DDPOptimizer splits the graph at the gradient buckets, so all-reduce still overlaps
    the backward; `model` stays the plain module, so checkpoints have the same keys compiled
    or not."""
    return torch.compile(net)  # type: ignore[return-value]


def build_parts(
    config: TrainerConfig, rank: int, local_rank: int, world_size: int, distributed: bool
) -> Parts:
    """The parts of one process of a run of ``world_size`` processes (rank ``rank``), as a
    fresh run has them: a resume loads its checkpoint into them, then :func:`fit_to_run`."""
    device = pick_device(config.device, local_rank)
    workload = build_workload(config)  # the same on every rank: torch is seeded with `seed`
    seed_rngs(config.seed, rank)  # each rank's own generators from here on
    model = workload.model.to(device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    precision = resolve_amp(config.amp, device.type, bf16_native(device))
    scaler = torch.amp.GradScaler(device.type, enabled=precision.grad_scaler)

    global_batch = config.global_batch_size
    num_samples = len(workload.train_set)  # type: ignore[arg-type]
    state = TrainState(global_batch, num_samples, rank, config.seed, world_size)
    cap = micro_batch_cap(config.micro_batch_size, state.micro_batch_cap)
    batches = batch_share(global_batch, world_size, rank, cap)
    per_epoch = steps_per_epoch(num_samples, global_batch)
    if per_epoch == 0:
        raise ValueError(
            f"globalBatchSize ({global_batch}) exceeds the training set ({num_samples} samples)"
        )
    return Parts(
        device=device,
        model=model,
        net=model,
        optimizer=optimizer,
        scaler=scaler,
        precision=precision,
        train_set=workload.train_set,
        test_set=workload.test_set,
        loss_fn=workload.loss_fn,
        count_targets=workload.count_targets,
        batches=batches,
        data_workers=resolve_workers(config.data_workers, device.type),
        per_epoch=per_epoch,
        total_steps=total_steps(config.epochs, per_epoch, config.max_steps),
        peak_lr=peak_lr(config.lr, global_batch, config.base_batch_size, config.scale_lr),
        state=state,
    )


def fit_to_run(parts: Parts, config: TrainerConfig, distributed: bool) -> None:
    """After the resume (or at a fresh start): this rank's batches under the run's micro-batch
    cap (which the checkpoint holds), DDP around the model (:func:`_ddp`), and
    ``torch.compile`` around that (trainer.compile). Wrapping after the resume also means DDP's
    broadcast of rank 0's weights sends the weights every rank has just loaded."""
    share = parts.batches
    cap = micro_batch_cap(config.micro_batch_size, parts.state.micro_batch_cap)
    parts.batches = batch_share(share.global_batch_size, share.world_size, share.rank, cap)
    if parts.net is not parts.model:  # fitted already
        return
    if distributed:
        parts.net = _ddp(parts, config)
    if config.compile:
        parts.net = compiled(parts.net)


def _ddp(parts: Parts, config: TrainerConfig) -> DistributedDataParallel:
    """DDP around the model, with static_graph only where :func:`use_static_graph` allows it."""
    static = use_static_graph(config.static_graph, parts.batches)
    if config.static_graph and not static:
        log.warning(
            "trainer.staticGraph is turned off for this start: each step runs %d micro-batches "
            "per rank (gradient accumulation), which DDP's static graph does not support "
            "(pytorch/pytorch#143580)",
            parts.batches.accumulation_steps,
        )
    device = parts.device
    return DistributedDataParallel(
        parts.model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=config.bucket_cap_mb,
        gradient_as_bucket_view=config.gradient_as_bucket_view,
        static_graph=static,
    )
