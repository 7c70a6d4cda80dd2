"""A run held at two steps: it waits at each until released, then goes on to the end."""

from __future__ import annotations

import pytest
from trainer_harness import Launcher, events, last_step, wait_until

from ddp_trainer.hold import release

SETTINGS = {
    "workload": "digits",
    "epochs": 1,
    "globalBatchSize": 64,
    "amp": "off",
    "checkpointEverySteps": 5,
    "logEverySteps": 1,
    "evaluate": False,
    "holdAtSteps": [3, 6],
}


@pytest.mark.timeout(180)
def test_a_held_run_waits_for_each_release_and_then_finishes(launcher: Launcher) -> None:
    ckpt = launcher.workdir / "ckpt"
    run = launcher.alone("held", settings=SETTINGS, checkpoint_dir=ckpt)

    wait_until(lambda: events(ckpt, "hold"), 90, "the hold after step 3")
    assert last_step(ckpt) == 3 and run.popen.poll() is None
    assert "holding after step 3 until" in run.output()
    release(ckpt, 3)

    wait_until(lambda: len(events(ckpt, "hold")) == 2, 90, "the hold after step 6")
    assert last_step(ckpt) == 6 and run.popen.poll() is None
    # Step 5's checkpoint was written before the hold: what the test sees is on disk.
    assert [c["step"] for c in events(ckpt, "checkpoint")] == [5]
    release(ckpt, 6)

    assert run.wait(120) == 0, run.tail()
    assert [
        (h["step"], r["step"])
        for h, r in zip(events(ckpt, "hold"), events(ckpt, "release"), strict=True)
    ] == [(3, 3), (6, 6)]
    steps = [s["step"] for s in events(ckpt, "step")]
    assert steps == list(range(1, 1437 // 64 + 1))
