"""What a checkpoint holds besides the model, the optimizer and the GradScaler: where training
stands (the data position) and every random generator, as one Stateful part."""

from __future__ import annotations

import random
from typing import Any, Protocol

import numpy as np
import torch

from .batching import Position, settle


class Stateful(Protocol):
    """A part of a run that a checkpoint saves and a resume restores (torch modules, optimizers
    and GradScalers are Stateful as they are)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch generator states, as types a weights-only load accepts."""
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
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class TrainState:
    """The data position and the random generators. Its keys sit at the checkpoint's top level
    (``step``, ``epoch``, ``samplesInEpoch``, ``rng``), as they always have."""

    def __init__(self, global_batch: int, num_samples: int):
        self.global_batch, self.num_samples = global_batch, num_samples
        self.position = Position(step=0, epoch=0, samples_in_epoch=0)

    def state_dict(self) -> dict[str, Any]:
        p = self.position
        return {
            "step": p.step,
            "epoch": p.epoch,
            "samplesInEpoch": p.samples_in_epoch,
            "rng": rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_rng_state(state["rng"])
        saved = Position(state["step"], state["epoch"], state["samplesInEpoch"])
        # The saved cursor may leave less than a global batch of this world size in the epoch.
        self.position = settle(saved, self.global_batch, self.num_samples)
