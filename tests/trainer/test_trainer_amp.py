"""AMP on CPU: the bf16 autocast path trains; a GradScaler's state survives a checkpoint."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from trainer_harness import events

from ddp_api.trainer_config import TrainerConfig
from ddp_trainer.state.store import CheckpointStore
from ddp_trainer.step import autocast
from ddp_trainer.trainer import DistEnv, Trainer

SMALL = {"workload": "digits", "maxSteps": 6, "checkpointEverySteps": 3, "logEverySteps": 1}


pytestmark = pytest.mark.usefixtures("trainer_in_this_process")


def train(directory: Path, **settings: object) -> Trainer:
    trainer = Trainer(TrainerConfig.model_validate({**SMALL, **settings}), directory, DistEnv())
    assert trainer.train() == 0
    return trainer


def test_bf16_autocast_trains_on_cpu(tmp_path: Path) -> None:
    trainer = train(tmp_path, amp="auto")
    assert trainer.parts.precision.dtype == "bfloat16" and not trainer.parts.scaler.is_enabled()
    inputs = trainer.parts.train_set.tensors[0][:4]  # type: ignore[attr-defined]
    with autocast(trainer.parts):
        assert trainer.parts.model(inputs).dtype == torch.bfloat16
    (start,) = events(tmp_path, "start")
    assert start["amp"] == "bfloat16"
    assert all(math.isfinite(s["loss"]) for s in events(tmp_path, "step"))
    assert [s["step"] for s in events(tmp_path, "step")] == [1, 2, 3, 4, 5, 6]


def test_grad_scaler_state_is_checkpointed_and_restored(tmp_path: Path) -> None:
    first = train(tmp_path, amp="fp16")
    assert first.parts.precision.grad_scaler and first.parts.scaler.is_enabled()
    entry, state = CheckpointStore(tmp_path).latest() or (None, {})
    assert entry is not None and entry.step == 6
    saved = state["scaler"]
    assert saved["_growth_tracker"] > 0 and saved["scale"] == first.parts.scaler.get_scale()

    resumed = Trainer(TrainerConfig.model_validate({**SMALL, "amp": "fp16"}), tmp_path, DistEnv())
    assert resumed.parts.scaler.state_dict()["_growth_tracker"] == 0  # a fresh scaler
    resumed.resume()
    assert resumed.parts.scaler.state_dict() == saved
    assert resumed.position.step == 6
