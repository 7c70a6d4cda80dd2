"""The rendezvous store is lost mid-run: nodes under ``ddp_trainer.node`` ride it out.

This is what the operator's pods run. torchrun alone exits when its store goes away (each pod
would fail); the node supervisor sees the store was replaced, waits for the new one, starts
torchrun again, and training resumes from the newest checkpoint.
"""

from __future__ import annotations

import pytest
from trainer_harness import Launcher, events, last_step, wait_until

from ddp_devcluster.recipes import DIGITS_STEPS_PER_EPOCH, digits
from ddp_trainer.launch.store_probe import read_store_id, split_endpoint

SETTINGS = digits(
    epochs=2, checkpointEverySteps=10, logEverySteps=1, pgTimeoutS=30, holdAtSteps=[15]
)
TOTAL = 2 * DIGITS_STEPS_PER_EPOCH


@pytest.mark.timeout(300)
def test_nodes_survive_the_store_being_replaced_and_finish(launcher: Launcher) -> None:
    ckpt = launcher.workdir / "ckpt"
    store, endpoint = launcher.store()
    first_id = read_store_id(endpoint)
    assert first_id
    nodes = launcher.agents(
        ("node-0", "node-1"),
        endpoint=endpoint,
        nnodes="2:2",
        settings=SETTINGS,
        checkpoint_dir=ckpt,
        supervised=True,
    )
    wait_until(lambda: events(ckpt, "hold"), 150, "the hold after step 15")
    store.kill_tree()  # the store pod is gone ...
    launcher.store(port=split_endpoint(endpoint)[1], name="rdzv-store-2")  # ... and replaced
    assert read_store_id(endpoint) not in (None, first_id)

    for node in nodes:
        assert node.wait(200) == 0, launcher.logs()
        assert "the rendezvous store no longer answers" in node.output() or (
            "the rendezvous store was replaced" in node.output()
        )
    (restart,) = [s for s in events(ckpt, "start") if s["resumedFrom"]]
    assert restart["step"] == 15  # rank 0 saved the held step when torchrun stopped it
    assert last_step(ckpt) == TOTAL
    steps = [s["step"] for s in events(ckpt, "step")]
    assert sorted(set(steps)) == list(range(1, TOTAL + 1))
    assert len(events(ckpt, "hold")) == 1  # resumed after step 15: it never held again


@pytest.mark.timeout(200)
def test_a_training_failure_is_passed_on_not_retried(launcher: Launcher) -> None:
    """The same store still answers after torchrun failed: the pod's failure is real."""
    ckpt = launcher.workdir / "ckpt"
    _, endpoint = launcher.store()
    bad = {**SETTINGS, "holdAtSteps": [], "workload": "plugin_workload:missing"}
    node = launcher.node(
        "node-0",
        endpoint=endpoint,
        nnodes="1:1",
        settings=bad,
        checkpoint_dir=ckpt,
        max_restarts=0,
        supervised=True,
    )
    assert node.wait(150) != 0, node.output()
    assert "torchrun failed with exit code" in node.output()
    assert "starting torchrun again" not in node.output()
