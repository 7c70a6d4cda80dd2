"""A checkpoint written by the current release resumes exactly: every part comes back as saved.

tests/trainer/fixtures/checkpoint-e7a9ec4 was written by the trainer at e7a9ec4 (release 0.1.0,
before TrainState became a Stateful part of the checkpoint) with ``python -m ddp_trainer
--checkpoint-dir ckpt`` alone and DDP_TRAINER_CONFIG set to ``SETTINGS`` with ``maxSteps`` 4
(and ``metricsPort`` 0); only its manifest and checkpoint are kept. 100 samples make 3 global
batches of 32 an epoch, so step 4 stands 32 samples into epoch 1; fp16 on CPU gives it a
GradScaler state, 2 micro-batches and clipping run too.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from trainer_harness import events

from ddp_api.trainer_config import TrainerConfig
from ddp_devcluster.recipes import synthetic
from ddp_trainer.data.batching import Position
from ddp_trainer.trainer import DistEnv, Trainer

FIXTURE = Path(__file__).parent / "fixtures" / "checkpoint-e7a9ec4"
SETTINGS = synthetic(
    syntheticSamples=100,
    microBatchSize=16,
    amp="fp16",
    gradClipNorm=1.0,
    seed=5,
    checkpointKeep=1,
    maxSteps=7,
)
# The checkpoint's top-level keys at e7a9ec4: what every later trainer writes and reads.
KEYS = {
    "format",
    "model",
    "optimizer",
    "scaler",
    "step",
    "epoch",
    "samplesInEpoch",
    "rng",
    "config",
    "worldSize",
    "globalBatchSize",
    "writer",
    "time",
}


pytestmark = pytest.mark.usefixtures("trainer_in_this_process")


def same(a: Any, b: Any) -> bool:
    """Nested dicts, lists and tuples of tensors and plain values are equal (tensors exactly)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and torch.equal(a, b)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def trainer(directory: Path) -> Trainer:
    return Trainer(TrainerConfig.model_validate(SETTINGS), directory, DistEnv())


def test_a_checkpoint_of_the_current_release_resumes_exactly(tmp_path: Path) -> None:
    saved = torch.load(FIXTURE / "step-00000004.pt", weights_only=True)
    assert set(saved) == KEYS
    ckpt = tmp_path / "resumed"
    shutil.copytree(FIXTURE, ckpt)

    resumed = trainer(ckpt)
    resumed.resume()
    assert resumed.position == Position(step=4, epoch=1, samples_in_epoch=32)
    parts = resumed.parts
    assert same(parts.model.state_dict(), saved["model"])
    assert same(parts.optimizer.state_dict(), saved["optimizer"])
    assert parts.optimizer.state_dict()["state"]  # AdamW's moments, not a fresh optimizer
    assert same(parts.scaler.state_dict(), saved["scaler"]) and saved["scaler"]["scale"] > 0
    rng = saved["rng"]
    assert same(torch.get_rng_state(), rng["torch"])
    version, internal, gauss = rng["python"]
    assert random.getstate() == (version, tuple(internal), gauss)
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
    assert (name, pos, has_gauss, cached) == tuple(rng["numpy"][0:1] + rng["numpy"][2:])
    assert np.array_equal(keys, rng["numpy"][1].numpy().astype(np.uint32))

    assert resumed.train() == 0  # training goes on from step 4 to 7
    (start,) = events(ckpt, "start")
    assert start["resumedFrom"] == "step-00000004.pt" and start["step"] == 4
    resumed_steps = events(ckpt, "step")
    assert [(s["step"], s["epoch"], s["samplesInEpoch"]) for s in resumed_steps] == [
        (5, 1, 64),
        (6, 2, 0),
        (7, 2, 32),
    ]
    new = torch.load(ckpt / "step-00000007.pt", weights_only=True)
    assert set(new) == KEYS | {"microBatchCap", "rngByRank"} and new["step"] == 7

    # The same as a run that never stopped: the resume lost and changed nothing.
    straight = trainer(tmp_path / "straight")
    assert straight.train() == 0
    losses = {s["step"]: s["loss"] for s in events(tmp_path / "straight", "step")}
    for step in resumed_steps:
        assert step["loss"] == pytest.approx(losses[step["step"]], rel=1e-4)
    for key, value in straight.parts.model.state_dict().items():
        torch.testing.assert_close(resumed.parts.model.state_dict()[key], value)
