"""A checkpoint written before the trainer's checkpoint contents changed still resumes.

tests/trainer/fixtures/checkpoint-format-1 was written by the trainer at 434ae50 (it still has
the `scheduler` block that nothing read): synthetic workload, 8 inputs, 16 hidden, seed 3,
global batch 32, stopped after step 2.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from trainer_harness import Launcher, events

from ddp_devcluster.recipes import synthetic

FIXTURE = Path(__file__).parent / "fixtures" / "checkpoint-format-1"
SETTINGS = synthetic(syntheticSamples=256, seed=3, checkpointKeep=1, maxSteps=4)


@pytest.mark.timeout(120)
def test_a_checkpoint_of_the_previous_format_resumes(launcher: Launcher) -> None:
    old = torch.load(FIXTURE / "step-00000002.pt", weights_only=True)
    assert "scheduler" in old and old["step"] == 2  # really the previous format
    ckpt = launcher.workdir / "ckpt"
    shutil.copytree(FIXTURE, ckpt)

    run = launcher.alone("resumed", settings=SETTINGS, checkpoint_dir=ckpt)
    assert run.wait(90) == 0, run.tail()
    (start,) = events(ckpt, "start")
    assert start["resumedFrom"] == "step-00000002.pt" and start["step"] == 2
    assert [s["step"] for s in events(ckpt, "step")] == [3, 4]
    new = torch.load(ckpt / "step-00000004.pt", weights_only=True)
    assert "scheduler" not in new and new["step"] == 4
