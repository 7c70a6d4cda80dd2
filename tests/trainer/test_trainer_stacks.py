"""A hung step writes every thread's stack of every worker to the log before the operator's
progress deadline (``DDPJOB_PROGRESS_DEADLINE_S``): one rank deadlocks in its loss, the other
waits for it in the step's gradient all-reduce, and both say where; a PerStep replica group
that hangs says where too."""

from __future__ import annotations

import pytest
from replica_groups import committed_step, group_env, lighthouse, pod
from trainer_harness import Launcher, events, wait_until

from ddp_trainer.reporting.stacks import BEFORE_DEADLINE, FLOOR_S, SPREAD_S, dump_after_s

SETTINGS = {
    "workload": "padded_workload:hang_at_step",
    "epochs": 1,
    "maxSteps": 20,
    "globalBatchSize": 50,
    "amp": "off",
    "checkpointEverySteps": 0,
    "logEverySteps": 1,
    "evaluate": False,
    "device": "cpu",
}


def test_the_stacks_come_at_three_quarters_of_the_operators_deadline() -> None:
    assert dump_after_s("8", 0.1) == 6.0
    assert dump_after_s("0", 5.0) is None  # the deadline is off
    assert dump_after_s("", 0.5) == BEFORE_DEADLINE * FLOOR_S  # the default: its floor ...
    assert dump_after_s(None, 120.0) == BEFORE_DEADLINE * 1200  # ... or ten steps' time


def test_the_local_ranks_of_a_pod_dump_one_after_another_all_before_the_deadline() -> None:
    assert dump_after_s("8", 0.1, local_rank=1, local_ranks=2) == 6.0 + SPREAD_S
    last = dump_after_s("4", 0.1, local_rank=7, local_ranks=8)  # a short deadline: less apart
    assert last is not None and 3.0 < last < 3.5


@pytest.mark.timeout(120)
def test_a_hung_step_writes_every_ranks_stack_to_the_log(launcher: Launcher) -> None:
    ckpt = launcher.workdir / "ckpt"
    env = {"HANG_STEP": "4", "HANG_RANKS": "1", "DDPJOB_PROGRESS_DEADLINE_S": "4"}
    run = launcher.standalone("run", nproc=2, settings=SETTINGS, checkpoint_dir=ckpt, extra_env=env)
    wait_until(lambda: events(ckpt, "step"), 60, "the first steps")

    def both_dumped() -> bool:
        out = run.output()
        # rank 1 where it hangs, rank 0 waiting for it in the step's backward (its all-reduce)
        return "padded_workload.py" in out and "in backward" in out

    wait_until(both_dumped, 60, "a stack dump from each rank")
    assert run.popen.poll() is None  # still hung: the dump ends nothing
    assert max(s["step"] for s in events(ckpt, "step")) == 3
    out = run.output()
    assert "most recent call first" in out and "in loss_fn" in out and "in _train_step" in out
    run.kill_tree()


@pytest.mark.timeout(120)
def test_a_per_step_group_whose_step_hangs_writes_its_stack_to_the_log(
    launcher: Launcher,
) -> None:
    """PerStep mode arms the same dump after each committed step: a group hung in its loss says
    where (the operator's stall message says the workers wrote their stacks)."""
    ckpt, samples = launcher.workdir / "ckpt", launcher.workdir / "samples"
    _, url = lighthouse(launcher, heartbeat_ms=1000, join_ms=300)
    env = group_env(0, url, groups=1, timeout_s=5.0, samples=samples)
    env.update(HANG_STEP="4", DDPJOB_PROGRESS_DEADLINE_S="4")
    run = pod(launcher, "group-0", env=env, settings=SETTINGS, checkpoint_dir=ckpt)
    wait_until(lambda: committed_step(samples) >= 3, 90, "the first steps")
    wait_until(lambda: "in loss_fn" in run.output(), 30, "the hung group's stack")
    assert run.popen.poll() is None  # still hung: the dump ends nothing
    assert committed_step(samples) == 3
    assert "most recent call first" in run.output()
    run.kill_tree()
