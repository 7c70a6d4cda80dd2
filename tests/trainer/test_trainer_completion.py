"""The end of a run: a node lost at the last step, and a replacement that starts after training
completed. Real torchrun agents under ``ddp_trainer.node`` on loopback, as the operator's pods
run them."""

from __future__ import annotations

import time

import pytest
from trainer_harness import Launcher, Proc, events, last_step, wait_until

from ddp_devcluster.recipes import DIGITS_STEPS_PER_EPOCH, digits
from ddp_trainer.hold import release
from ddp_trainer.state.store import read_completion

TOTAL = DIGITS_STEPS_PER_EPOCH  # one epoch
SETTINGS = digits(  # held after training completed
    epochs=1, checkpointEverySteps=10, logEverySteps=1, pgTimeoutS=30, holdAtSteps=[TOTAL]
)


@pytest.mark.timeout(300)
def test_a_node_lost_at_the_end_is_not_waited_for_and_a_late_node_exits_zero(
    launcher: Launcher,
) -> None:
    ckpt = launcher.workdir / "ckpt"
    _, endpoint = launcher.store()

    def node(name: str) -> Proc:
        return launcher.node(
            name, endpoint=endpoint, nnodes="2:2", settings=SETTINGS,
            checkpoint_dir=ckpt, rdzv_id="job-uid", supervised=True,
        )  # fmt: skip

    survivor, lost = node("node-0"), node("node-1")
    # Both nodes hold after training completed: the record is written, the collectives are over.
    wait_until(lambda: events(ckpt, "hold"), 200, "the hold after the last step")
    done = read_completion(ckpt)
    assert done is not None and (done.run_id, done.step) == ("job-uid", TOTAL)
    assert last_step(ckpt) == TOTAL
    lost.kill_tree()  # its machine is gone at the last step
    released = time.monotonic()
    release(ckpt, TOTAL)
    # The survivor's agent waits at its exit barrier for a peer that never comes: bounded.
    assert survivor.wait(120) == 0, launcher.logs()
    assert time.monotonic() - released < 60
    assert "Error waiting on exit barrier" in survivor.output()

    # A replacement of the lost node starts after training completed: it does not train.
    late = node("node-1-again")
    assert late.wait(60) == 0, late.output()
    assert "exiting 0 without starting torchrun" in late.output()
    assert len(events(ckpt, "start")) == 1  # no second run started
