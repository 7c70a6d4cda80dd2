"""Elasticity on loopback: a node dies, a node joins; training resumes and finishes."""

from __future__ import annotations

import pytest
from trainer_harness import Launcher, events, free_port, last_step, wait_until

from ddp_devcluster.recipes import DIGITS_STEPS_PER_EPOCH, digits
from ddp_trainer.hold import release

ELASTIC = digits(epochs=3, checkpointEverySteps=25, logEverySteps=5, pgTimeoutS=30, evaluate=True)
TOTAL = 3 * DIGITS_STEPS_PER_EPOCH


def steps_at_world(ckpt, world: int) -> list[dict]:
    return [s for s in events(ckpt, "step") if s["worldSize"] == world]


@pytest.mark.timeout(300)
def test_node_loss_with_dedicated_store_resumes_and_finishes(launcher: Launcher) -> None:
    """Kill the first agent (the one that would host the store by default) mid-run."""
    store, ckpt, (first, second) = launcher.elastic_pair(
        ("node-a", "node-b"), {**ELASTIC, "holdAtSteps": [30]}
    )
    wait_until(lambda: events(ckpt, "hold"), 150, "the hold after step 30")
    assert [s for s in steps_at_world(ckpt, 2) if s["step"] == 30]
    assert [c["step"] for c in events(ckpt, "checkpoint")] == [25]
    first.kill_tree()  # the whole node: agent and its worker
    killed_at = last_step(ckpt)
    release(ckpt, 30)

    assert second.wait(200) == 0, launcher.logs()
    starts = events(ckpt, "start")
    resumed = [s for s in starts if s["worldSize"] == 1 and s["resumedFrom"]]
    assert resumed, starts
    assert resumed[-1]["step"] <= killed_at
    (end,) = events(ckpt, "end")
    assert end["step"] == TOTAL and end["worldSize"] == 1
    assert steps_at_world(ckpt, 1)[-1]["step"] == TOTAL
    assert {s["globalBatchSize"] for s in events(ckpt, "step")} == {64}
    assert {s["perRankBatch"] for s in steps_at_world(ckpt, 1)} == {64}
    assert store.popen.poll() is None  # the store outlived the node


@pytest.mark.timeout(200)
def test_node_loss_of_the_store_hosting_agent_ends_the_job(launcher: Launcher) -> None:
    """Without a dedicated store the first agent hosts it: killing it strands the others.

    This is why the operator runs a dedicated store (`ddp_api.rdzv_store`) in its own pod.
    """
    ckpt = launcher.workdir / "ckpt"
    endpoint = f"127.0.0.1:{free_port()}"
    host, other = launcher.agents(
        ("host", "other"),
        host="host",
        endpoint=endpoint,
        nnodes="1:2",
        settings={**ELASTIC, "holdAtSteps": [20]},  # never released: it ends mid-run
        checkpoint_dir=ckpt,
    )
    wait_until(lambda: events(ckpt, "hold"), 150, "the hold after step 20")
    assert steps_at_world(ckpt, 2)
    host.kill_tree()
    assert other.wait(120) != 0, launcher.logs()
    assert not events(ckpt, "end")
    assert last_step(ckpt) < TOTAL


@pytest.mark.timeout(300)
def test_scale_up_from_two_to_three_nodes(launcher: Launcher) -> None:
    ckpt = launcher.workdir / "ckpt"
    _, endpoint = launcher.store()
    # Held after step 40 and never released: the third node's arrival makes the agents stop
    # the workers (SIGTERM: rank 0 saves step 40) and start them again at world size 3.
    settings = {**ELASTIC, "holdAtSteps": [40]}
    common = dict(endpoint=endpoint, nnodes="2:3", settings=settings, checkpoint_dir=ckpt)
    nodes = [launcher.node(f"node-{i}", **common) for i in range(2)]
    wait_until(lambda: events(ckpt, "hold"), 150, "the hold after step 40")
    assert steps_at_world(ckpt, 2)[-1]["step"] == 40
    nodes.append(launcher.node("node-2", **common))

    for node in nodes:
        assert node.wait(240) == 0, launcher.logs()
    three = steps_at_world(ckpt, 3)
    assert three, launcher.logs()
    assert {s["globalBatchSize"] for s in events(ckpt, "step")} == {64}
    assert {s["perRankBatch"] for s in three} == {22}  # rank 0's share of 64 = 22 + 21 + 21
    resumed = [s for s in events(ckpt, "start") if s["worldSize"] == 3]
    assert resumed and resumed[0]["resumedFrom"]
    # The workers were stopped with SIGTERM for the re-rendezvous: rank 0 saved that step.
    assert resumed[0]["step"] == 40 == max(s["step"] for s in steps_at_world(ckpt, 2))
    (end,) = events(ckpt, "end")
    assert end["step"] == TOTAL and end["worldSize"] == 3
