"""Kueue preemption end to end: real Kueue, the operator with ``DDP_KUEUE=true``, and the
pods of both jobs running torchrun for real in containers on the kind cluster's machines.

A low-priority job holds after a known step (``holdAtSteps``) when a high-priority job arrives:
Kueue evicts the low one, its pods get SIGTERM (rank 0 saves the held step), the high one
runs to Succeeded, and the low one, admitted again, resumes right after its checkpoint.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from e2e_scenario import CLAIMS, Scenario, resumed_at, resumes

from ddp_devcluster.harness import holding_at
from ddp_devcluster.kueue import queue_objects
from ddp_trainer.reporting.run_log import read_run_log

pytestmark = pytest.mark.e2e
HELD = 25  # the low job's step when the high one arrives


def queues(sc: Scenario) -> None:
    """A ClusterQueue with quota for one digits job (2 nodes x 500m), preempting by priority."""
    quota = {"cpu": "1", "memory": "8Gi"}
    sc.apply(*queue_objects(sc.ns, "team", f"cq-{sc.ns}", f"f-{sc.ns}", quota))
    for name, value in (("ddp-low", 100), ("ddp-high", 1000)):
        sc.s.kubectl("create", "priorityclass", name, f"--value={value}", check=False)


def queued(priority: str, *more: Any) -> Any:
    def edit(job: dict[str, Any]) -> None:
        job["metadata"].setdefault("labels", {})["kueue.x-k8s.io/queue-name"] = "team"
        job["spec"]["template"] = {"priorityClassName": priority}
        for e in more:
            e(job)

    return edit


def every_step_logged(job: dict[str, Any]) -> None:
    job["spec"]["trainer"]["logEverySteps"] = 1


def renamed(name: str, claim: str) -> Any:
    """Another job of the example, on its own claim, and short: only its arrival matters."""

    def edit(job: dict[str, Any]) -> None:
        job["metadata"]["name"] = name
        job["spec"]["checkpoint"]["volume"]["persistentVolumeClaim"]["claimName"] = claim
        job["spec"]["trainer"]["maxSteps"] = 10

    return edit


def test_a_preempted_job_checkpoints_waits_and_resumes_exactly_after_its_checkpoint(
    sc: Scenario,
) -> None:
    queues(sc)
    sc.apply_example(
        CLAIMS,
        "digits.yaml",
        edit=queued("ddp-low", holding_at(HELD, last=HELD + 5), every_step_logged),
    )
    sc.held("digits", HELD)
    assert sc.status("digits")["admissions"] == 1

    sc.apply_example(
        CLAIMS, "digits.yaml", edit=queued("ddp-high", renamed("urgent", "charlm-checkpoints"))
    )
    evicted = sc.until(
        "digits evicted by Kueue",
        lambda: [e for e in _events(sc, "digits") if e[1] == "Evicted"] or None,
    )
    assert "Preempted" in evicted[0][2]
    low = sc.until(
        "digits Queued with its pods gone",
        lambda: (
            (
                (st := sc.status("digits")).get("phase") == "Queued"
                and not sc.workers("digits")
                and st
            )
            or None
        ),
    )
    assert low["restarts"] == 0
    sc.phase("urgent", "Succeeded", 300)
    status = sc.phase("digits", "Succeeded", 300)
    assert status["admissions"] == 2 and status["restarts"] == 0
    assert "Readmitted" in [e[1] for e in _events(sc, "digits")]

    rows = read_run_log(sc.claim("digits-checkpoints"))
    # SIGTERM made rank 0 save the held step; the new run started from exactly there.
    assert resumed_at(rows) == [HELD]
    assert resumes(rows) == [(HELD, HELD + 1)]
    steps = [int(r["step"]) for r in rows if r.get("event") == "step"]
    assert steps == list(range(1, status["progress"]["totalSteps"] + 1))  # none twice or skipped


def _events(sc: Scenario, job: str) -> list[tuple[str, str, str]]:
    out = json.loads(
        sc.k("get", "events", "-o", "json", "--field-selector", f"involvedObject.name={job}")
    )
    return [(e["type"], e["reason"], e["message"]) for e in out["items"]]
