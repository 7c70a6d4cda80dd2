"""A step whose loss or gradient is not finite is skipped and counted; too many in a row fail the
run with a reason that names trainer.maxNonFiniteSteps."""

from __future__ import annotations

import math

import pytest
from trainer_harness import Launcher, events

from ddp_trainer.state.store import CheckpointStore

SETTINGS = {
    "workload": "padded_workload:nan_at_steps",
    "epochs": 1,
    "maxSteps": 6,
    "globalBatchSize": 50,  # 20 steps per epoch of the 1000 spirals
    "amp": "off",
    "checkpointEverySteps": 0,
    "logEverySteps": 1,
    "evaluate": False,
    "device": "cpu",
}


@pytest.mark.timeout(180)
def test_one_non_finite_step_on_one_rank_is_skipped_by_every_rank(launcher: Launcher) -> None:
    ckpt = launcher.workdir / "ckpt"
    nan = {"NAN_STEPS": "3", "NAN_RANKS": "1"}
    run = launcher.standalone("run", nproc=2, settings=SETTINGS, checkpoint_dir=ckpt, extra_env=nan)
    assert run.wait(150) == 0, run.tail()
    steps = events(ckpt, "step")
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    # The data position advanced through the skipped step as through any other.
    assert [s["samplesInEpoch"] for s in steps] == [50 * s["step"] for s in steps]
    assert [s["skippedSteps"] for s in steps] == [0, 0, 1, 1, 1, 1]
    for line in steps:
        assert math.isfinite(line["gradNorm"]) == (line["step"] != 3), line
        assert math.isfinite(line["loss"]) == (line["step"] != 3), line
    assert "step 3: the loss or gradient is not finite" in run.output()
    found = CheckpointStore(ckpt).latest()
    assert found is not None
    entry, state = found
    assert entry.step == 6
    # The skipped step left no NaN in the weights.
    assert all(math.isfinite(float(v.abs().sum())) for v in state["model"].values())


@pytest.mark.timeout(120)
def test_consecutive_non_finite_steps_fail_the_run_naming_the_setting(launcher: Launcher) -> None:
    ckpt = launcher.workdir / "ckpt"
    settings = {**SETTINGS, "maxNonFiniteSteps": 3}
    run = launcher.alone(
        "run", settings=settings, checkpoint_dir=ckpt, extra_env={"NAN_STEPS": "2,3,4,5"}
    )
    code = run.wait(100)
    assert code == 3, run.tail()
    assert (
        "3 consecutive steps with a non-finite loss or gradient at step 4: lower lr, enable "
        "gradClipNorm, or raise trainer.maxNonFiniteSteps" in run.output()
    ), run.tail()
    assert [s["step"] for s in events(ckpt, "step")] == [1, 2, 3]
    assert not events(ckpt, "end")
