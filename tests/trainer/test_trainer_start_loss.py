"""A machine lost while a run starts costs its peers ``stepTimeoutS``, not ``pgTimeoutS``
(``ddp_trainer.start_watch``): before it, the survivors sat in the model's broadcast, or their
first step's all-reduce, for ``pgTimeoutS`` (1800 s).

Two nodes of an elastic job (1 to 2 nodes) under ``ddp_trainer.node``, as the operator's pods
run them, on the test's own rendezvous store; the first process of rank ``BUILD_RANK`` waits
while it builds the workload (``padded_workload:wait_in_build``), so its peer waits for it in
the model's broadcast, and its node is frozen with SIGSTOP there (a machine gone silent: no
FIN, no RST). The other node must then train alone at world size 1 and finish. Rank 1 lost is a
peer of the rank that hosts torchrun's store; rank 0 lost takes that store with it."""

from __future__ import annotations

import time

import pytest
from padded_workload import six_steps
from trainer_harness import Launcher, events, node_of, wait_until

STEP_TIMEOUT_S = 10
# pgTimeoutS: the default (1800 s), what the start no longer waits for
SETTINGS = six_steps("padded_workload:wait_in_build", stepTimeoutS=STEP_TIMEOUT_S)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("lost_rank", [1, 0])
def test_a_machine_lost_while_the_run_starts_holds_the_others_for_the_step_timeout(
    launcher: Launcher, lost_rank: int
) -> None:
    marker = launcher.workdir / "building"
    # Both nodes in the world that builds: a round the first node formed alone (the second
    # slow to start) waits for the full one instead of training.
    env = {"BUILD_RANK": str(lost_rank), "BUILD_MARKER": str(marker), "BUILD_WORLD_SIZE": "2"}
    _, ckpt, nodes = launcher.elastic_pair(
        ("node-0", "node-1"), SETTINGS, supervised=True, extra_env=env
    )
    lost = node_of(marker, nodes, 240, f"rank {lost_rank}'s build")
    (survivor,) = [n for n in nodes if n is not lost]
    lost.freeze_tree()
    frozen = time.monotonic()

    def alone() -> list[dict]:
        return [s for s in events(ckpt, "step") if s["worldSize"] == 1]

    wait_until(alone, 150, "a step at world size 1 while the lost machine is frozen")
    waited = time.monotonic() - frozen
    assert survivor.wait(120) == 0, survivor.tail()
    assert "gave no sign of life" in survivor.output(), survivor.tail()
    assert not [s for s in events(ckpt, "step") if s["worldSize"] == 2]
    (end,) = events(ckpt, "end")
    assert end["worldSize"] == 1 and end["step"] == SETTINGS["maxSteps"]
    lost.kill_tree()
    print(f"rank {lost_rank} frozen at the start: the survivor's first step {waited:.1f}s later")
