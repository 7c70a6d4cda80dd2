"""The store and then three workers lost in turn fit the default budget: one disruption costs
one restart. (Losing the store pod alone, with no worker failing and no restart counted, is
shown across machines by tests/cluster/test_cluster.py.)

The scenario holds the job at known steps (``spec.trainer.holdAtSteps``) and disrupt it there,
so they act mid-run on any machine. The store pod is deleted as a user or a node drain would;
so are the node pods, both of them in turn, so that rank 0's pod is among the lost whichever
pod it runs in: each loss is one restart and a resume from the newest checkpoint.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from e2e_scenario import CLAIMS, Scenario, resumed_at

from ddp_devcluster.harness import holding_at
from ddp_trainer.reporting.run_log import read_run_log

pytestmark = pytest.mark.e2e
EVERY = 20  # digits.yaml's checkpoint.everySteps


def store_uid(sc: Scenario) -> str | None:
    out = sc.k("get", "pod", "digits-rdzv", "-o", "json", "--ignore-not-found")
    return json.loads(out)["metadata"]["uid"] if out.strip() else None


def resumes_after_losing_the_store(sc: Scenario) -> int:
    """Deletes the store pod while the job is held; waits for the operator's new store and for
    the workers to resume from a checkpoint; returns the step they resumed from."""
    ckpt = sc.claim("digits-checkpoints")
    before = len(resumed_at(read_run_log(ckpt)))
    old = store_uid(sc)
    sc.k("delete", "pod", "digits-rdzv", "--wait=false")

    def new_store_running() -> bool:
        out = sc.k("get", "pod", "digits-rdzv", "-o", "json", "--ignore-not-found")
        if not out.strip():
            return False
        pod: dict[str, Any] = json.loads(out)
        return pod["metadata"]["uid"] != old and pod["status"].get("phase") == "Running"

    def resumed() -> int | None:
        starts = resumed_at(read_run_log(ckpt))
        return starts[-1] if len(starts) > before else None

    sc.until("a new store pod running", new_store_running)
    return sc.until("the workers resuming from a checkpoint", resumed)


def reasons(sc: Scenario) -> list[str]:
    out = sc.k("get", "events", "--field-selector", "involvedObject.name=digits", "-o", "json")
    return [e["reason"] for e in json.loads(out)["items"]]


def test_the_store_and_then_three_workers_lost_in_turn_fit_the_default_budget(
    sc: Scenario,
) -> None:
    sc.apply_example(CLAIMS, "digits.yaml", edit=holding_at(10, 25, 40, 55))
    sc.held("digits", 10)
    assert 10 - EVERY < resumes_after_losing_the_store(sc) <= 10
    for step, node in ((25, 0), (40, 1), (55, 0)):
        sc.held("digits", step)
        # Waits until the pod is gone: its workers stopped, so the held step is behind us.
        sc.k("delete", "pod", f"digits-node-{node}")
        sc.release("digits-checkpoints", step)

    status = sc.phase("digits", "Succeeded", 300)
    assert status["restarts"] == 3  # backoffLimit defaults to 3: the store's loss was free
    assert status["progress"]["step"] == status["progress"]["totalSteps"]
    assert reasons(sc).count("PodDisrupted") == 3 and "BackoffLimitExceeded" not in reasons(sc)
    # Each disruption came while held at 10, 25, 40 or 55: every resume is from a checkpoint
    # less than one checkpoint interval (20 steps) before it.
    starts = resumed_at(read_run_log(sc.claim("digits-checkpoints")))
    assert len(starts) == 4, starts
    for held, start in zip((10, 25, 40, 55), starts, strict=True):
        assert held - EVERY < start <= held, f"resumed from {start} after a loss at {held}"
