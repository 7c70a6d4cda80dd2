"""A machine that goes silent mid-training (power off, partition): no FIN, no RST, nothing.

Its node is frozen with SIGSTOP (agent and worker) at a hold point, with the operator's own
``PET_RDZV_CONF`` and the trainer's default ``pgTimeoutS``: the survivor of the elastic job must
train again at world size 1 while the silent node is still frozen, and finish. Before
``stepTimeoutS`` the survivor sat in its gloo all-reduce for ``pgTimeoutS`` (1800 s). The run
sets ``stepTimeoutS: 15`` (the default's 60 s is the same code path, 45 s longer; the first
test holds the defaults to their bound, and `bench/silent_peer.py` measures them).
"""

from __future__ import annotations

import pytest
from trainer_harness import Launcher, events, last_step, wait_until

from ddp_api.trainer_config import TrainerConfig
from ddp_devcluster.recipes import DIGITS_STEPS_PER_EPOCH, digits
from ddp_operator.render import RDZV_CONF
from ddp_trainer.hold import release

HOLD = 30
# no pgTimeoutS: its default is what stepTimeoutS must cut short
SETTINGS = digits(
    epochs=2, checkpointEverySteps=25, logEverySteps=5, holdAtSteps=[HOLD], stepTimeoutS=15
)
TOTAL = 2 * DIGITS_STEPS_PER_EPOCH


def test_the_defaults_notice_a_silent_peer_within_the_wait_below() -> None:
    config = TrainerConfig()
    # 180 s below: the step timeout, the 15 s last call, a worker start, with room to spare.
    assert config.steady_timeout_s <= 120 < config.pg_timeout_s
    assert "last_call_timeout=15" in RDZV_CONF


@pytest.mark.timeout(480)
def test_the_survivor_of_a_silent_peer_trains_on_alone_and_finishes(launcher: Launcher) -> None:
    store, ckpt, (silent, survivor) = launcher.elastic_pair(
        ("silent", "survivor"),
        SETTINGS,
        rdzv_conf=RDZV_CONF,  # the operator's
    )
    wait_until(lambda: events(ckpt, "hold"), 200, f"the hold after step {HOLD}")
    assert last_step(ckpt) == HOLD
    assert {s["worldSize"] for s in events(ckpt, "step")} == {2}
    assert [c["step"] for c in events(ckpt, "checkpoint")] == [25]
    silent.freeze_tree()
    release(ckpt, HOLD)

    def alone() -> list[dict]:
        return [s for s in events(ckpt, "step") if s["worldSize"] == 1]

    wait_until(alone, 180, "a step at world size 1 while the peer is frozen")
    assert silent.popen.poll() is None  # still there, still silent: nothing told the survivor
    silent.kill_tree()

    assert survivor.wait(300) == 0, launcher.logs()
    resumed = [s for s in events(ckpt, "start") if s["worldSize"] == 1]
    assert resumed, events(ckpt, "start")
    assert resumed[0]["resumedFrom"] and resumed[0]["step"] in (25, HOLD)
    assert resumed[0]["attempt"] >= 1  # the survivor's worker failed and torchrun restarted it
    steps = alone()
    assert steps[0]["step"] == resumed[0]["step"] + 1  # from the checkpoint, no step skipped
    assert steps[-1]["step"] == TOTAL
    (end,) = events(ckpt, "end")
    assert end["step"] == TOTAL and end["worldSize"] == 1
    assert {s["perRankBatch"] for s in steps} == {64}
    assert store.popen.poll() is None
