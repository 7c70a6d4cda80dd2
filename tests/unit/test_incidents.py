"""What each incident cost: opened when the planner counts it, closed by the next report."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from ddp_api.ddpjob import DDPJob
from ddp_operator import incidents, render
from ddp_operator.planner import views
from ddp_operator.planner.plan import PlanSettings, plan

START = "2026-11-26T10:00:00Z"


def report(step: int, at: str, eta: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"step": step, "totalSteps": 100, "updatedAt": at}
    if eta is not None:
        out["estimatedRemainingSeconds"] = eta
    return out


def test_a_report_after_the_incident_closes_it_with_its_cost() -> None:
    before = report(40, "2026-11-26T10:05:00Z", eta=120)  # 2 s a step
    open_ = incidents.opened([], "NodeLost", "2026-11-26T10:05:10Z", before)
    assert open_ == [{"kind": "NodeLost", "detectedAt": "2026-11-26T10:05:10Z", "atStep": 40}]
    status = {"startTime": START, "firstReportTime": START, "incidents": open_}
    status["keptSeconds"] = 290.0
    stale = report(40, "2026-11-26T10:05:05Z")  # written before the loss, read after it
    assert incidents.account(status, before, stale)[1] == []
    resumed = report(36, "2026-11-26T10:05:41Z")  # from the checkpoint of step 35
    changes, closed = incidents.account(status, before, resumed)
    assert closed == [
        {
            "kind": "NodeLost",
            "detectedAt": "2026-11-26T10:05:10Z",
            "atStep": 40,
            "resumedAt": "2026-11-26T10:05:41Z",
            "seconds": 31.0,
            "resumedStep": 36,
            "stepsRedone": 5,
            # the 41 s between the reports around it, and the first run of steps 36 to 40
            "lostSeconds": 51.0,
        }
    ]
    assert changes["incidents"] == closed
    assert changes["keptSeconds"] == 280.0  # 5 redone steps of 2 s no longer count
    assert changes["goodput"] == round(280 / 341, 3)


def test_time_between_reports_that_move_the_step_is_kept() -> None:
    status = {"startTime": START, "firstReportTime": START, "keptSeconds": 100.0}
    changes, closed = incidents.account(
        status, report(10, "2026-11-26T10:02:00Z"), report(15, "2026-11-26T10:02:10Z")
    )
    assert closed == [] and changes["keptSeconds"] == 110.0 and "incidents" not in changes
    assert changes["goodput"] == round(110 / 130, 3)
    held = incidents.account(
        status, report(15, "2026-11-26T10:02:10Z"), report(15, "2026-11-26T10:02:20Z")
    )[0]
    assert held["keptSeconds"] == 100.0  # no step, no kept time


def test_goodput_counts_from_the_first_report_not_the_start_up() -> None:
    # A 90 s job: 30 s to start, steps of 1 s, one incident that cost 21 s at 10:00:50.
    first = report(1, "2026-11-26T10:00:30Z", eta=99)
    changes = incidents.account({"startTime": START}, None, first)[0]
    assert changes["firstReportTime"] == "2026-11-26T10:00:30Z" and "goodput" not in changes
    status: dict[str, Any] = {"startTime": START, **changes}
    at_50 = report(21, "2026-11-26T10:00:50Z", eta=79)
    status.update(incidents.account(status, first, at_50)[0])
    assert status["keptSeconds"] == 20.0 and status["goodput"] == 1.0
    status["incidents"] = incidents.opened([], "Disruption", "2026-11-26T10:00:51Z", at_50)
    back = report(22, "2026-11-26T10:01:11Z", eta=78)  # the others trained on: nothing redone
    status.update(incidents.account(status, at_50, back)[0])
    end = report(40, "2026-11-26T10:01:30Z")
    changes = incidents.account(status, back, end)[0]
    assert "firstReportTime" not in changes  # set once
    # 20 s, the 1 step across the incident at the 1 s a step before it, then 19 s.
    assert changes["keptSeconds"] == 40.0
    assert changes["goodput"] == round(40 / 60, 3)  # 0.667: from startTime it read 0.444


def test_steps_the_other_groups_trained_across_an_incident_count_at_the_pace_before_it() -> None:
    # PerStep: 2 s a step before a group was lost; the others trained 20 steps in the 60 s
    # between the reports around the loss, stalled and at a slower pace with fewer groups.
    before = report(40, "2026-11-26T10:05:00Z", eta=120)
    status = {"firstReportTime": START, "keptSeconds": 290.0}
    status["incidents"] = incidents.opened([], "Disruption", "2026-11-26T10:05:10Z", before)
    changes, closed = incidents.account(status, before, report(60, "2026-11-26T10:06:00Z"))
    assert closed[0]["stepsRedone"] == 0
    assert changes["keptSeconds"] == 290.0 + 20 * 2.0  # kept at the pace before: 40 s of 60
    assert closed[0]["lostSeconds"] == 20.0  # the stall and the slower pace
    # A pace not known (one report before the incident) keeps none of that time.
    status["incidents"] = incidents.opened([], "Disruption", "2026-11-26T10:05:10Z", before)
    unpaced = report(40, "2026-11-26T10:05:00Z")
    unknown = incidents.account(status, unpaced, report(60, "2026-11-26T10:06:00Z"))[0]
    assert unknown["keptSeconds"] == 290.0


def test_incidents_that_close_together_are_one_outage() -> None:
    # A lost machine: its pod's incident and the failure of a peer it took down, then a resume
    # from the checkpoint of step 35 (2 s a step before it): steps 36 to 40 are redone once.
    before = report(40, "2026-11-26T10:05:00Z", eta=120)
    both = incidents.opened([], "NodeLost", "2026-11-26T10:05:10Z", before)
    both = incidents.opened(both, "Failure", "2026-11-26T10:05:12Z", before)
    status = {"firstReportTime": START, "keptSeconds": 290.0, "incidents": both}
    changes, closed = incidents.account(status, before, report(36, "2026-11-26T10:05:41Z"))
    assert [i["stepsRedone"] for i in closed] == [5, 5]
    assert changes["keptSeconds"] == 280.0  # 5 steps of 2 s lost once, not twice
    assert [i["lostSeconds"] for i in closed] == [51.0, 51.0]
    # A group lost while the others waited at a hold point: the pause is no one's loss.
    held = {**report(60, "2026-11-26T10:07:00Z"), "heldAtStep": 60}
    status = {"firstReportTime": START, "keptSeconds": 290.0}
    status["incidents"] = incidents.opened([], "Disruption", "2026-11-26T10:07:05Z", held)
    changes, closed = incidents.account(status, held, report(60, "2026-11-26T10:08:00Z"))
    assert closed[0]["lostSeconds"] == 0.0 and changes["heldSeconds"] == 60.0


def test_time_paused_at_a_hold_point_is_neither_kept_nor_lost() -> None:
    status: dict[str, Any] = {"firstReportTime": START, "keptSeconds": 45.0}
    at_hold = {**report(30, "2026-11-26T10:01:00Z", eta=70), "heldAtStep": 30}
    status.update(incidents.account(status, report(20, "2026-11-26T10:00:50Z", eta=80), at_hold)[0])
    assert status["keptSeconds"] == 55.0 and "heldSeconds" not in status
    released = report(30, "2026-11-26T10:06:00Z")  # the trainer reports at once on release
    changes = incidents.account(status, at_hold, released)[0]
    assert changes["heldSeconds"] == 300.0 and changes["keptSeconds"] == 55.0
    status.update(changes)
    changes = incidents.account(status, released, report(40, "2026-11-26T10:06:10Z"))[0]
    assert "heldSeconds" not in changes  # unchanged: not written again
    assert changes["goodput"] == round(65 / 70, 3)  # 65 s kept of 370 s, 300 of them paused


def test_a_job_reported_before_first_report_time_was_kept_counts_from_its_start() -> None:
    status = {"startTime": START, "keptSeconds": 100.0}  # an older operator wrote this status
    changes = incidents.account(
        status, report(10, "2026-11-26T10:02:00Z"), report(15, "2026-11-26T10:02:10Z")
    )[0]
    assert changes["firstReportTime"] == START and changes["goodput"] == round(110 / 130, 3)


def test_the_newest_ten_are_kept() -> None:
    many: list[dict[str, Any]] = []
    for i in range(12):
        many = incidents.opened(many, "Failure", f"2026-11-26T10:{i:02d}:00Z", None)
    assert len(many) == incidents.KEPT and many[0]["detectedAt"] == "2026-11-26T10:02:00Z"


JOB = DDPJob.model_validate(
    {"metadata": {"name": "j", "namespace": "ns", "uid": "u"}, "spec": {"nodes": 2}}
)
NOW = dt.datetime(2026, 11, 26, 10, 5, 10, tzinfo=dt.UTC)


def worker(index: int, phase: str = "Running") -> views.PodView:
    return views.PodView(
        name=render.worker_name("j", index),
        uid=f"u-{index}-{phase}",
        role=render.ROLE_WORKER,
        index=index,
        phase=phase,
        ready=phase == "Running",
        deleting=False,
        exit_code=1 if phase == "Failed" else None,
    )


def test_the_planner_opens_an_incident_for_a_failure_and_a_report_closes_it() -> None:
    status = {
        "phase": "Running",
        "reason": "AllNodesRunning",
        "startTime": START,
        "progress": report(40, "2026-11-26T10:05:00Z", eta=120),
    }
    pods = [worker(0), worker(1, "Failed")]
    failed = plan(JOB, status, pods, NOW, PlanSettings())
    (incident,) = failed.status["incidents"]
    assert incident == {"kind": "Failure", "detectedAt": "2026-11-26T10:05:10Z", "atStep": 40}
    later = {**status, **failed.status, "phase": "Running"}
    back = plan(
        JOB, later, [worker(0)], NOW + dt.timedelta(seconds=30), PlanSettings(),
        progress={**report(31, "2026-11-26T10:05:39Z"), "epoch": None},
    )  # fmt: skip
    (closed,) = back.closed
    assert closed["seconds"] == 29.0 and closed["stepsRedone"] == 10
    assert back.status["incidents"] == [closed]


def test_the_first_report_after_an_incident_keeps_the_pace_from_before_it() -> None:
    # Seen on kind: the store replaced 4 s after a checkpoint of the last reported step; the
    # first step after the resume came 17 s after that report, and the ETA read 3720 s.
    status = {
        "phase": "Running",
        "reason": "AllNodesRunning",
        "startTime": START,
        "progress": report(40, "2026-11-26T10:05:00Z", eta=120),  # 2 s a step
    }
    pods = [worker(0), worker(1, "Failed")]
    failed = plan(JOB, status, pods, NOW, PlanSettings())
    later = {**status, **failed.status, "phase": "Running"}
    back = plan(
        JOB, later, [worker(0)], NOW + dt.timedelta(seconds=30), PlanSettings(),
        progress=report(41, "2026-11-26T10:05:39Z"),
    )  # fmt: skip
    assert back.status["progress"]["estimatedRemainingSeconds"] == 118  # 59 steps at 2 s
    after = {**later, **back.status}
    on = plan(
        JOB, after, [worker(0)], NOW + dt.timedelta(seconds=40), PlanSettings(),
        progress=report(51, "2026-11-26T10:05:49Z"),
    )  # fmt: skip
    assert on.status["progress"]["estimatedRemainingSeconds"] == 49  # 1 s a step since


def test_kubectl_scale_opens_a_resize_and_a_lost_pod_only_its_own_incident() -> None:
    status = {"phase": "Running", "reason": "AllNodesRunning", "startTime": START}
    scaled = DDPJob.model_validate(
        {
            "metadata": {"name": "j", "namespace": "ns", "uid": "u", "generation": 2},
            "spec": {"nodes": 3, "minNodes": 1, "maxNodes": 4},
        }
    )
    grown = plan(
        scaled, {**status, "observedGeneration": 1}, [worker(0), worker(1)], NOW,
        PlanSettings(),
    )  # fmt: skip
    assert [i["kind"] for i in grown.status["incidents"]] == ["Resize"]
    evicted = dataclasses.replace(worker(1), disrupted="EvictionByEvictionAPI")
    same = {**status, "observedGeneration": None}
    lost = plan(JOB, same, [worker(0), evicted], NOW, PlanSettings())
    assert [i["kind"] for i in lost.status["incidents"]] == ["Disruption"]
