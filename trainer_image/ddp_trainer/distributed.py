"""This process's place in the group and the group's collectives: where torchrun put it, joining
the process group, how long a collective waits for a silent peer, and flags every rank agrees on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ddp_api.trainer_config import TrainerConfig


@dataclass(frozen=True)
class DistEnv:
    """Where this process stands, from the variables torchrun sets (alone: rank 0 of 1)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1  # this node's processes
    restart_count: int = 0
    launched: bool = False  # started by torchrun: join a process group even when alone
    run_id: str = ""  # torchrun's rendezvous id (the DDPJob's uid): names the completion record

    @classmethod
    def from_env(cls, environ: Any = None) -> DistEnv:
        environ = os.environ if environ is None else environ
        if "RANK" not in environ:
            return cls()
        return cls(
            rank=int(environ["RANK"]),
            local_rank=int(environ.get("LOCAL_RANK", 0)),
            world_size=int(environ.get("WORLD_SIZE", 1)),
            local_world_size=int(environ.get("LOCAL_WORLD_SIZE", 1)),
            restart_count=int(environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
            launched=True,
            run_id=environ.get("TORCHELASTIC_RUN_ID", ""),
        )


def init_distributed(env: DistEnv, config: TrainerConfig) -> None:
    """Join the process group torchrun prepared: NCCL on CUDA, gloo on CPU."""
    if not env.launched or dist.is_initialized():
        return
    use_cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    dist.init_process_group(
        backend="nccl" if use_cuda else "gloo",
        timeout=timedelta(seconds=config.pg_timeout_s),
    )


def set_collective_timeout(timeout: timedelta) -> None:
    """Sets the default process group's timeout for its next collectives (``dist.set_timeout``;
    ``_set_pg_timeout`` in older torch releases)."""
    setter = getattr(dist, "set_timeout", None) or dist.distributed_c10d._set_pg_timeout
    setter(timeout)


class CollectiveTimeout:
    """The timeout of this process's next collectives (``pgTimeoutS`` while a run starts,
    ``stepTimeoutS`` once every rank took its first step; the end needs no collective,
    :mod:`ddp_trainer.end_together`): how long it waits in one for a peer that went
    silent."""

    def __init__(self, seconds: int, distributed: bool):
        self.seconds, self.distributed = seconds, distributed  # init_distributed's at first

    def set(self, seconds: int) -> None:
        if self.distributed and seconds != self.seconds:
            set_collective_timeout(timedelta(seconds=seconds))
            self.seconds = seconds


def any_rank(flags: list[bool], device: torch.device, distributed: bool) -> list[bool]:
    """Each flag, set when it is set on some rank: the same answer on every rank (a collective)."""
    values = torch.tensor([float(flag) for flag in flags], device=device)
    if distributed:
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return [bool(value) for value in values]


class StepAgreement:
    """What every rank learns at the start of a step from one small all-reduce (a sum): whether
    some rank was asked to stop (SIGTERM), and the loss terms of the whole global batch. The
    result stays on the device until read, so nothing waits for it before the backward pass."""

    def __init__(self, stop: bool, terms: int, device: torch.device, distributed: bool):
        pinned = device.type == "cuda"  # a copy from pinned memory does not wait for the GPU
        values = torch.tensor([int(stop), terms], dtype=torch.int64, pin_memory=pinned)
        self.values = values.to(device, non_blocking=True)
        if distributed:
            dist.all_reduce(self.values)  # the collective timeout applies: a dead peer fails it

    @property
    def global_terms(self) -> torch.Tensor:
        return self.values[1]

    def stop(self) -> bool:
        """Whether any rank asked to stop: every rank stops after this same step."""
        return bool(self.values[0] > 0)


class Interrupted(Exception):
    """SIGTERM arrived (here, or on a peer): every rank stops after the same step."""
