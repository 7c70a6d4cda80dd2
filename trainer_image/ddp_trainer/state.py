"""The Stateful parts a checkpoint is made of: what one is, how their states make up one
checkpoint, and TrainState, the part for where training stands (the data position) and every
random generator."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import torch

from .batching import Position, settle


class Stateful(Protocol):
    """A part of a run that a checkpoint saves and a resume restores (torch modules, optimizers
    and GradScalers are Stateful as they are)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


AT_TOP = ""
"""The key of the part whose keys sit at the checkpoint's top level, not under a key of their
own: TrainState's (``step``, ``epoch``, ``samplesInEpoch``, ``rng``), as they always have."""


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
    """The data position and the random generators: the Stateful part under AT_TOP, so its keys
    sit at the checkpoint's top level (``step``, ``epoch``, ``samplesInEpoch``, ``rng``)."""

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
