"""Building a run: from its settings and the process's place in the group to the parts the
training loop uses (model, optimizer, precision, batches, state). No training happens here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from ddp_api.trainer_config import TrainerConfig

from .amp import Precision, resolve_amp
from .batching import BatchShare, batch_share, steps_per_epoch, total_steps
from .loader import resolve_workers
from .schedule import peak_lr
from .state import AT_TOP, Stateful, TrainState
from .workloads import build_workload


@dataclass
class Parts:
    """Everything one process trains with; the Stateful ones go into every checkpoint."""

    device: torch.device
    model: torch.nn.Module  # the plain module: checkpoints hold its weights without `module.`
    net: torch.nn.Module  # what the forward pass runs: the model, or DDP around it, compiled
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    precision: Precision
    train_set: Any
    test_set: Any
    loss_fn: Any
    batches: BatchShare  # this rank's share of each global batch
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


def compiled(net: torch.nn.Module) -> torch.nn.Module:
    """`torch.compile` of what the forward runs. Around DDP, as PyTorch's DDP notes advise:
    its DDPOptimizer splits the graph at the gradient buckets, so all-reduce still overlaps
    the backward; `model` stays the plain module, so checkpoints have the same keys compiled
    or not."""
    return torch.compile(net)  # type: ignore[return-value]


def build_parts(
    config: TrainerConfig, rank: int, local_rank: int, world_size: int, distributed: bool
) -> Parts:
    """The parts of one process of a run of ``world_size`` processes (rank ``rank``)."""
    device = pick_device(config.device, local_rank)
    workload = build_workload(config)
    model = workload.model.to(device)
    net: torch.nn.Module = model
    if distributed:
        net = DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=config.bucket_cap_mb,
            gradient_as_bucket_view=config.gradient_as_bucket_view,
            static_graph=config.static_graph,
        )
    if config.compile:
        net = compiled(net)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    bf16_ok = device.type == "cpu" or torch.cuda.is_bf16_supported()
    precision = resolve_amp(config.amp, device.type, bf16_ok)
    scaler = torch.amp.GradScaler(device.type, enabled=precision.grad_scaler)

    global_batch = config.global_batch_size
    batches = batch_share(global_batch, world_size, rank, config.micro_batch_size)
    num_samples = len(workload.train_set)  # type: ignore[arg-type]
    per_epoch = steps_per_epoch(num_samples, global_batch)
    if per_epoch == 0:
        raise ValueError(
            f"globalBatchSize ({global_batch}) exceeds the training set ({num_samples} samples)"
        )
    return Parts(
        device=device,
        model=model,
        net=net,
        optimizer=optimizer,
        scaler=scaler,
        precision=precision,
        train_set=workload.train_set,
        test_set=workload.test_set,
        loss_fn=workload.loss_fn,
        batches=batches,
        data_workers=resolve_workers(config.data_workers, device.type),
        per_epoch=per_epoch,
        total_steps=total_steps(config.epochs, per_epoch, config.max_steps),
        peak_lr=peak_lr(config.lr, global_batch, config.base_batch_size, config.scale_lr),
        state=TrainState(global_batch, num_samples),
    )
