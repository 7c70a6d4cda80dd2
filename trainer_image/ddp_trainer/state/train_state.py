"""The Stateful parts a checkpoint is made of: what one is, how their states make up one
checkpoint, and TrainState, the part for where training stands (the data position) and every
random generator."""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist

from ddp_trainer.data.batching import Position, largest_share, settle, step_seed

log = logging.getLogger("ddp_trainer.trainer")  # the trainer's lines: people and tests grep them


class Stateful(Protocol):
    """A part of a run that a checkpoint saves and a resume restores (torch modules, optimizers
    and GradScalers are Stateful as they are)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


AT_TOP = ""
"""The key of the part whose keys sit at the checkpoint's top level, not under a key of their
own: TrainState's (``step``, ``epoch``, ``samplesInEpoch``, ``rng``, ...), as they always have."""


def gather(parts: Mapping[str, Stateful]) -> dict[str, Any]:
    """The states of a checkpoint's parts: each one's under its key (the AT_TOP one's spread)."""
    state: dict[str, Any] = {}
    for key, part in parts.items():
        if key == AT_TOP:
            state.update(part.state_dict())
        else:
            state[key] = part.state_dict()
    return state


def scatter(state: Mapping[str, Any], parts: Mapping[str, Stateful]) -> None:
    """Loads each part's state out of a checkpoint (:func:`gather`'s inverse)."""
    for key, part in parts.items():
        if key == AT_TOP:
            part.load_state_dict(dict(state))
        elif state.get(key):  # a GradScaler's state is empty (or None) when it was off
            part.load_state_dict(state[key])


def rng_state() -> dict[str, Any]:
    """This process's Python, NumPy and torch generator states (on CUDA, the current device's
    only), as types a weights-only load accepts."""
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": [
            name,
            torch.from_numpy(np.asarray(keys).astype(np.int64)),
            pos,
            has_gauss,
            cached,
        ],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def cuda_state_for(saved: Any, device_index: int) -> torch.Tensor | None:
    """The saved CUDA generator state for the device ``device_index``: a checkpoint holds the
    state of the device its rank used; older ones hold a list, one per device then visible,
    of which only this device's is taken (None: the list has none for it)."""
    if isinstance(saved, torch.Tensor):
        return saved
    if isinstance(saved, list | tuple) and device_index < len(saved):
        return saved[device_index]
    return None


def set_rng_state(state: dict[str, Any]) -> None:
    """Restores :func:`rng_state`'s states in this process (CUDA: the current device's only, so
    a resume where fewer GPUs are visible works)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = cuda_state_for(state["cuda"], torch.cuda.current_device())
        if cuda is not None:
            torch.cuda.set_rng_state(cuda)


def seed_rngs(seed: int, rank: int, step: int = 0) -> None:
    """Fresh Python, NumPy and torch generators for ``rank`` at ``step`` of a run seeded with
    ``seed``: a run's start, and a rank whose state no checkpoint holds (a rank a resize added)."""
    value = step_seed(seed, step, rank)
    random.seed(value)
    np.random.seed(value % 2**32)
    torch.manual_seed(value)


def rng_for_rank(state: Mapping[str, Any], rank: int) -> dict[str, Any] | None:
    """The generator states a checkpoint holds for ``rank`` (None: it holds none). ``rngByRank``
    lists every rank's (None for a rank that could not send its own); checkpoints of an older
    format hold rank 0's only, as ``rng``."""
    by_rank = state.get("rngByRank")
    if by_rank is None:
        return state.get("rng") if rank == 0 else None
    return by_rank[rank] if rank < len(by_rank) else None


def rng_fingerprint(state: Mapping[str, Any]) -> str:
    """A short digest of generator states (Python, NumPy, torch): equal states, equal digests."""
    digest = hashlib.sha256()
    digest.update(repr(state["python"]).encode())
    name, keys, pos, has_gauss, cached = state["numpy"]
    digest.update(keys.numpy().tobytes())
    digest.update(repr((name, pos, has_gauss, cached)).encode())
    digest.update(state["torch"].numpy().tobytes())
    return digest.hexdigest()[:16]


def all_ranks_rng(distributed: bool) -> list[dict[str, Any] | None] | None:
    """Every rank's generator states, gathered on rank 0 (None elsewhere): a collective, so every
    rank calls it at the same checkpoint."""
    own = rng_state()
    if not distributed:
        return [own]
    rank, world = dist.get_rank(), dist.get_world_size()
    gathered: list[Any] = [None] * world if rank == 0 else []
    dist.gather_object(own, gathered if rank == 0 else None, dst=0)
    return gathered if rank == 0 else None


class TrainState:
    """The data position, the run's micro-batch cap and the random generators: the Stateful
    part under AT_TOP, so its keys sit at the checkpoint's top level (``step``, ``epoch``,
    ``samplesInEpoch``, ``microBatchCap``, ``rng``: rank 0's, ``rngByRank``: every rank's)."""

    def __init__(
        self, global_batch: int, num_samples: int, rank: int = 0, seed: int = 0, world_size: int = 1
    ):
        self.global_batch, self.num_samples = global_batch, num_samples
        self.rank, self.seed = rank, seed
        self.position = Position(step=0, epoch=0, samples_in_epoch=0)
        # The largest per-rank batch of the run's first start: a fresh run's is this start's.
        self.micro_batch_cap = largest_share(global_batch, world_size)
        self.restored_rng = "fresh"  # where this rank's generators came from (for the log)
        # Every rank's generator states for the checkpoint of ``step`` (rank 0; see collect).
        self._ranks_rng: tuple[int, list[dict[str, Any] | None]] | None = None

    def collect_rng(self, distributed: bool) -> None:
        """Gathers every rank's generator states for the checkpoint of the current step (a
        collective: every rank calls it before that checkpoint)."""
        gathered = all_ranks_rng(distributed)
        self._ranks_rng = None if gathered is None else (self.position.step, gathered)

    def state_dict(self) -> dict[str, Any]:
        p = self.position
        own = rng_state()
        by_rank: list[dict[str, Any] | None] = [own]
        if self._ranks_rng is not None and self._ranks_rng[0] == p.step:
            by_rank = self._ranks_rng[1]
        return {
            "step": p.step,
            "epoch": p.epoch,
            "samplesInEpoch": p.samples_in_epoch,
            "microBatchCap": self.micro_batch_cap,
            "rng": by_rank[0] or own,
            "rngByRank": by_rank,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = Position(state["step"], state["epoch"], state["samplesInEpoch"])
        # A checkpoint without a cap is older: the per-rank batch it was written with ran.
        world = state.get("worldSize")
        cap = state.get("microBatchCap")
        if cap is None and world:
            cap = largest_share(self.global_batch, world)
        if cap is not None:
            self.micro_batch_cap = cap
        rng = rng_for_rank(state, self.rank)
        if rng is None:
            seed_rngs(self.seed, self.rank, saved.step)
            self.restored_rng = f"fresh from (seed, rank {self.rank}, step {saved.step})"
        else:
            set_rng_state(rng)
            self.restored_rng = f"saved by rank {self.rank}"
        # The saved cursor may leave less than a global batch of this world size in the epoch.
        self.position = settle(saved, self.global_batch, self.num_samples)


def log_restored_rng(state: TrainState, world_size: int, distributed: bool) -> None:
    """Rank 0 logs where each rank's random generators came from and a digest of them (a
    small collective, once per start): a resume shows each rank continuing its own."""
    here = [f"{state.restored_rng} ({rng_fingerprint(rng_state())})"]
    ranks: list[Any] = [None] * world_size if distributed else []
    if distributed:
        dist.all_gather_object(ranks, here[0])
    for rank, what in enumerate(ranks or here):
        log.info("random generators of rank %d after the resume: %s", rank, what)
