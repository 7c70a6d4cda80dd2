"""Token-weighted loss: a padded language-model plugin trains to the same weights as 1 rank x 1
micro-batch, 1 rank x 2 micro-batches and 2 ranks x 1 micro-batch (the mean over every real
token of the global batch, however it is split)."""

from __future__ import annotations

import math

import pytest
import torch
from trainer_harness import Launcher, events

from ddp_trainer.state.store import CheckpointStore

SETTINGS = {
    "workload": "padded_workload:build",
    "epochs": 1,
    "maxSteps": 3,
    "globalBatchSize": 8,
    "amp": "off",
    "seed": 3,
    "warmupSteps": 0,
    "checkpointEverySteps": 0,
    "logEverySteps": 1,
    "evaluate": False,
    "device": "cpu",
}


def final_weights(directory) -> dict[str, torch.Tensor]:
    found = CheckpointStore(directory).latest()
    assert found is not None
    entry, state = found
    assert entry.step == 3
    return state["model"]


@pytest.mark.timeout(240)
def test_one_rank_with_micro_batches_equals_two_ranks_equals_one_batch(
    launcher: Launcher,
) -> None:
    runs = {
        "whole": launcher.alone("whole", settings=SETTINGS, checkpoint_dir=launcher.workdir / "a"),
        "micro": launcher.alone(
            "micro",
            settings={**SETTINGS, "microBatchSize": 4},
            checkpoint_dir=launcher.workdir / "b",
        ),
        "ranks": launcher.standalone(
            "ranks", nproc=2, settings=SETTINGS, checkpoint_dir=launcher.workdir / "c"
        ),
    }
    for proc in runs.values():
        assert proc.wait(180) == 0, proc.tail()
    folders = {name: launcher.workdir / f for name, f in zip(runs, "abc", strict=True)}
    assert {s["accumulation"] for s in events(folders["micro"], "step")} == {2}
    assert {s["worldSize"] for s in events(folders["ranks"], "step")} == {2}

    reference = final_weights(folders["whole"])
    for name in ("micro", "ranks"):
        weights = final_weights(folders[name])
        for key, value in reference.items():
            assert torch.allclose(weights[key], value, rtol=0, atol=1e-6), (name, key)
        # The loss told is the token-weighted mean too.
        for mine, theirs in zip(
            events(folders[name], "step"), events(folders["whole"], "step"), strict=True
        ):
            assert math.isclose(mine["loss"], theirs["loss"], rel_tol=1e-6), (name, mine)
