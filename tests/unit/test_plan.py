"""The pure planner: what the operator decides for each observed state."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest
from ddpjobs import ddpjob
from planner_pods import pod

from ddp_api.ddpjob import DDPJob
from ddp_operator import render
from ddp_operator.planner import converge, draft, lost_machines, stall, views
from ddp_operator.planner.plan import PlanSettings, plan

NOW = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
CFG = render.OperatorConfig(default_image="trainer:test")
RULES = PlanSettings(CFG, backoff_base_s=10)
LOST_30 = dataclasses.replace(RULES, node_lost_grace_s=30)


def job(**spec: Any) -> DDPJob:
    return ddpjob({"nodes": 2, **spec})


STORE = pod(-1, role=render.ROLE_STORE)


def created_pods(p: draft.Plan) -> list[str]:
    return [o["metadata"]["name"] for o in p.create if o["kind"] == "Pod"]


def test_new_job_creates_services_store_and_one_pod_per_node() -> None:
    p = plan(job(), {}, [], NOW, RULES)
    assert created_pods(p) == ["j-rdzv", "j-node-0", "j-node-1"]
    assert [o["metadata"]["name"] for o in p.create if o["kind"] == "Service"] == ["j-rdzv", "j"]
    assert p.status["phase"] == "Pending"
    assert p.status["ready"] == "0/2"
    assert p.status["selector"] == "ddp.dev/job-name=j,ddp.dev/role=worker"


def test_pods_created_but_not_yet_watched_are_not_created_again() -> None:
    p = plan(job(), {}, [], NOW, RULES, pending={"j-rdzv", "j-node-0"})
    assert created_pods(p) == ["j-node-1"]
    assert [m for _, r, m in p.events if r == "CreatingPods"] == ["creating j-node-1"]


def test_a_service_that_exists_is_not_created_again_and_a_service_s_name_is_no_pod() -> None:
    """The store pod and the store Service share the name j-rdzv: each kind is checked
    against what exists of its own kind."""
    p = plan(job(), {}, [], NOW, RULES, services={"j-rdzv": "u-1", "j": "u-1"})
    assert created_pods(p) == ["j-rdzv", "j-node-0", "j-node-1"]
    assert [o for o in p.create if o["kind"] == "Service"] == []
    again = plan(job(), {}, [STORE, pod(0)], NOW, RULES, services={"j-rdzv": "u-1"})
    assert created_pods(again) == ["j-node-1"]
    assert [o["metadata"]["name"] for o in again.create if o["kind"] == "Service"] == ["j"]
    assert p.adopt == again.adopt == []  # the job's own


def test_an_orphaned_service_of_the_jobs_name_is_adopted_and_an_earlier_jobs_left_to_go() -> None:
    # kubectl delete ddpjob j --cascade=orphan, then a new j: the Services nothing controls
    # serve it as they are, and it adopts them so they go with it. A Service another job
    # controls (an earlier j's, which the garbage collector has not deleted yet) is neither
    # adopted nor made again until it is gone.
    orphaned = {"j-rdzv": "", "j": "", "j-extra": ""}
    p = plan(job(), {}, [], NOW, RULES, services=orphaned)
    assert p.adopt == ["j-rdzv", "j"]  # not a Service the job does not make
    assert [o for o in p.create if o["kind"] == "Service"] == []
    earlier = plan(job(), {}, [], NOW, RULES, services={"j-rdzv": "u-0", "j": "u-0"})
    assert earlier.adopt == [] and [o for o in earlier.create if o["kind"] == "Service"] == []


def test_replanning_an_unchanged_state_creates_nothing_new() -> None:
    status = {"phase": "Running", "startTime": "2026-01-01T11:00:00Z"}
    p = plan(job(), status, [STORE, pod(0), pod(1)], NOW, RULES)
    assert created_pods(p) == []
    assert p.delete == []
    assert p.status["phase"] == "Running"


def test_scale_up_adds_the_next_indices_and_scale_down_removes_the_highest() -> None:
    status = {"phase": "Running", "startTime": "2026-01-01T11:00:00Z"}
    up = plan(job(nodes=4, minNodes=1, maxNodes=4), status, [STORE, pod(0), pod(1)], NOW, RULES)
    assert created_pods(up) == ["j-node-2", "j-node-3"]
    assert up.status["phase"] == "Scaling"
    down = plan(
        job(nodes=1, minNodes=1, maxNodes=4), status, [STORE, pod(0), pod(1), pod(2)], NOW, RULES
    )
    assert down.delete == ["j-node-1", "j-node-2"]
    assert created_pods(down) == []


def test_a_pod_not_ready_for_a_moment_is_no_scaling() -> None:
    # What a real kubelet reports as a node's torchrun exits: the container is not ready a
    # moment before the pod's phase becomes Succeeded. Seen on the real node as a spurious
    # "Scaling" at the end of every job.
    status = {"phase": "Running", "startTime": "2026-01-01T11:00:00Z"}
    finishing = dataclasses.replace(pod(1), ready=False)
    p = plan(job(), status, [STORE, pod(0), finishing], NOW, RULES)
    assert p.status["phase"] == "Running"
    assert [c["reason"] for c in p.status["conditions"] if c["type"] == "Running"] == [
        "NodesNotReady"
    ]
    assert created_pods(p) == [] and p.delete == []
    # A missing pod is still a change of size.
    p = plan(job(), status, [STORE, pod(0)], NOW, RULES)
    assert p.status["phase"] == "Scaling" and created_pods(p) == ["j-node-1"]


def test_a_failed_pod_is_counted_once_deleted_and_recreated_with_growing_backoff() -> None:
    status = {"phase": "Running", "startTime": "2026-01-01T11:00:00Z"}
    failed = pod(1, "Failed", uid="f1", exit_code=137)
    p = plan(job(), status, [STORE, pod(0), failed], NOW, RULES)
    assert p.status["restarts"] == 1
    assert p.status["phase"] == "Restarting"
    assert p.delete == ["j-node-1"]
    assert created_pods(p) == []  # not while the failed pod still exists
    assert ("Warning", "PodFailed") in [(t, r) for t, r, _ in p.events]
    # The same observation again (say after an operator restart): no second count.
    again = plan(job(), {**status, **p.status}, [STORE, pod(0), failed], NOW, RULES)
    assert again.status["restarts"] == 1
    assert again.delete == ["j-node-1"]
    # The first restart is immediate once the failed pod is gone.
    after = plan(job(), {**status, **p.status}, [STORE, pod(0)], NOW, RULES)
    assert created_pods(after) == ["j-node-1"]
    # A second failure waits for the backoff.
    second = pod(1, "Failed", uid="f2", exit_code=137)
    p2 = plan(job(), {**status, **after.status}, [STORE, pod(0), second], NOW, RULES)
    assert p2.status["restarts"] == 2
    gone = {**status, **p2.status}
    assert created_pods(plan(job(), gone, [STORE, pod(0)], NOW, RULES)) == []
    later = NOW + dt.timedelta(seconds=11)
    assert created_pods(plan(job(), gone, [STORE, pod(0)], later, RULES)) == ["j-node-1"]


def test_backoff_doubles_from_the_second_restart_and_is_capped() -> None:
    assert [converge.backoff_s(n, 10) for n in (1, 2, 3, 4)] == [0, 10, 20, 40]
    assert converge.backoff_s(30, 10) == converge.BACKOFF_CAP_S


def test_a_running_pod_deleted_by_someone_else_counts_as_a_restart() -> None:
    status = {"phase": "Running", "startTime": "2026-01-01T11:00:00Z"}
    lost = views.PodView("j-node-0", "u0", render.ROLE_WORKER, 0, "Running", True, True)
    p = plan(job(), status, [STORE, lost, pod(1)], NOW, RULES)
    assert p.status["restarts"] == 1 and p.status["phase"] == "Restarting"
    assert ("Warning", "PodDisrupted") in [(t, r) for t, r, _ in p.events]
    assert created_pods(p) == []  # the old pod still terminates; same name
    again = plan(job(), {**status, **p.status}, [STORE, lost, pod(1)], NOW, RULES)
    assert again.status["restarts"] == 1


EARLIER = "2026-01-01T11:00:00Z"  # when the job's first pods were created


def aged(x: views.PodView, created: str = EARLIER, **changes: Any) -> views.PodView:
    return dataclasses.replace(x, created=created, **changes)


def test_losing_the_store_costs_no_restart_and_recreates_it() -> None:
    status = {"phase": "Running", "startTime": EARLIER}
    store_gone = aged(STORE, deleting=True)
    p = plan(job(), status, [store_gone, aged(pod(0)), aged(pod(1))], NOW, RULES)
    assert p.status["restarts"] == 0 and p.status["phase"] == "Running"
    ((kind, reason, text),) = p.events
    assert (kind, reason) == ("Warning", "StoreLost") and "no restart counted" in text
    gone = plan(job(), {**status, **p.status}, [aged(pod(0)), aged(pod(1))], NOW, RULES)
    assert created_pods(gone) == ["j-rdzv"] and gone.status["restarts"] == 0


def test_workers_failing_with_the_store_cost_one_restart_together() -> None:
    """Own commands run plain torchrun, whose agents exit when the store goes."""
    status = {"phase": "Running", "startTime": EARLIER}
    observed = [
        aged(pod(0, "Failed", exit_code=1)),
        aged(STORE, deleting=True),
        aged(pod(1, "Failed", exit_code=1)),
    ]
    p = plan(job(), status, observed, NOW, RULES)
    assert p.status["restarts"] == 1 and p.status["phase"] == "Restarting"
    assert [r for t, r, _ in p.events if t == "Warning"] == ["StoreLost", "PodFailed"]
    assert sorted(p.delete) == ["j-node-0", "j-node-1"]  # failed pods go, all recorded
    assert len(p.status["handledFailures"]) == 3


def test_a_survivor_failing_soon_after_a_counted_failure_is_not_counted_again() -> None:
    status = {"phase": "Restarting", "startTime": EARLIER, "restarts": 1,
              "lastFailureTime": "2026-01-01T11:59:40Z", "handledFailures": ["gone"]}  # fmt: skip
    survivor = aged(pod(1, "Failed", uid="s", exit_code=1))  # 20 s after the loss
    p = plan(job(), status, [STORE, aged(pod(0)), survivor], NOW, RULES)
    assert p.status["restarts"] == 1 and p.delete == ["j-node-1"]
    assert not [r for t, r, _ in p.events if t == "Warning"]
    assert "s" in p.status["handledFailures"]
    # ... but past the window, or when the failed pod was made after the loss, it counts.
    late = plan(job(), status, [STORE, survivor], NOW + dt.timedelta(seconds=60), RULES)
    assert late.status["restarts"] == 2
    replacement = aged(pod(1, "Failed", uid="r", exit_code=1), created="2026-01-01T11:59:45Z")
    crash_loop = plan(job(), status, [STORE, aged(pod(0)), replacement], NOW, RULES)
    assert crash_loop.status["restarts"] == 2


def test_a_later_deletion_is_a_disruption_of_its_own_but_one_drain_is_one() -> None:
    status = {"phase": "Running", "startTime": EARLIER, "restarts": 1,
              "lastFailureTime": "2026-01-01T11:59:40Z", "handledFailures": ["gone"]}  # fmt: skip
    deleted = aged(pod(1, uid="d"), deleting=True)  # someone deleted it 20 s later
    p = plan(job(), status, [STORE, aged(pod(0)), deleted], NOW, RULES)
    assert p.status["restarts"] == 2
    assert [r for t, r, _ in p.events if t == "Warning"] == ["PodDisrupted"]
    # Two pods of one drain, seen a moment apart: one restart.
    drain = {**status, "lastFailureTime": "2026-01-01T11:59:58Z"}
    q = plan(job(), drain, [STORE, aged(pod(0)), deleted], NOW, RULES)
    assert q.status["restarts"] == 1 and not q.events


def test_pods_the_operator_deletes_itself_are_never_counted_as_failures() -> None:
    status = {"phase": "Running", "startTime": "2026-01-01T11:00:00Z"}
    s = plan(job(suspend=True), status, [STORE, pod(0), pod(1)], NOW, RULES)
    terminating = [
        views.PodView(x.name, x.uid, x.role, x.index, "Running", True, True)
        for x in (STORE, pod(0), pod(1))
    ]
    resumed = plan(job(), {**status, **s.status}, terminating, NOW, RULES)
    assert resumed.status["restarts"] == 0
    assert resumed.status["phase"] == "Pending"


def test_the_restart_budget_fails_the_job_when_spent() -> None:
    status = {"phase": "Restarting", "startTime": "2026-01-01T11:00:00Z", "restarts": 2}
    p = plan(job(backoffLimit=2), status, [STORE, pod(0), pod(1, "Failed", uid="x")], NOW, RULES)
    assert p.status["phase"] == "Failed"
    assert p.status["conditions"][-1]["reason"] == "BackoffLimitExceeded"
    assert "j-node-0" in p.delete and "j-rdzv" in p.delete
    assert any(r == "BackoffLimitExceeded" for _, r, _ in p.events)


@pytest.mark.parametrize(
    ("code", "permanent"), [(1, True), (127, True), (137, False), (143, False), (None, False)]
)
def test_exit_code_policy_fails_fast_only_for_program_errors(
    code: int | None, permanent: bool
) -> None:
    status = {"phase": "Running", "startTime": "2026-01-01T11:00:00Z"}
    p = plan(
        job(restartPolicy="ExitCode"),
        status,
        [STORE, pod(0), pod(1, "Failed", exit_code=code)],
        NOW,
        RULES,
    )
    assert (p.status["phase"] == "Failed") is permanent


def test_success_when_every_node_exits_zero() -> None:
    status = {"phase": "Running", "startTime": "2026-01-01T11:00:00Z"}
    one = plan(job(), status, [STORE, pod(0, "Succeeded"), pod(1)], NOW, RULES)
    assert one.status["phase"] == "Running" and created_pods(one) == []
    both = plan(job(), status, [STORE, pod(0, "Succeeded"), pod(1, "Succeeded")], NOW, RULES)
    assert both.status["phase"] == "Succeeded"
    assert both.status["completionTime"] == "2026-01-01T12:00:00Z"
    assert both.delete == ["j-rdzv"]


def finished(index: int, at: str = "2026-01-01T11:59:50Z", **changes: Any) -> views.PodView:
    """A node pod whose torchrun exited 0 at ``at`` (10 s before NOW by default)."""
    return aged(pod(index, "Succeeded", exit_code=0), finished=at, **changes)


RUNNING = {"phase": "Running", "startTime": EARLIER}


def test_a_node_lost_after_its_peer_finished_is_not_replaced_and_the_job_succeeds() -> None:
    lost = aged(pod(1, uid="l"), deleting=True)
    p = plan(job(), RUNNING, [STORE, finished(0), lost], NOW, RULES)
    assert created_pods(p) == [] and p.status["restarts"] == 0
    assert p.status["phase"] == "Succeeded"
    cond = p.status["conditions"][-1]
    assert cond["reason"] == "Completed"
    assert cond["message"] == "j-node-1 was lost after j-node-0 completed training"
    assert "l" in p.status["handledFailures"]
    # Once the pod is gone, no replacement either: the job stays done.
    later = plan(job(), {**RUNNING, **p.status}, [STORE, finished(0)], NOW, RULES)
    assert created_pods(later) == [] and "phase" not in later.status  # kept: Succeeded


def test_a_node_that_fails_after_the_last_step_is_not_counted_and_fails_no_job() -> None:
    # Seen on kind: both nodes trained step 66 of 66; one segfaulted on its way out (exit
    # 139) before its peer's exit 0 was seen, and was counted as restart 1 of the budget.
    trained = {**RUNNING, "progress": {"step": 66, "totalSteps": 66}}
    crashed = pod(0, "Failed", uid="c", exit_code=139)
    p = plan(job(backoffLimit=0), trained, [STORE, crashed, pod(1)], NOW, RULES)
    assert p.status["phase"] == "Running" and p.status["restarts"] == 0
    assert next((r, m) for _, r, m in p.events) == (
        "LostAfterTraining",
        "j-node-0 failed with exit code 139 after training reached its last step: not counted"
        " (the job completes once a node exits 0)",
    )
    assert p.delete == ["j-node-0"] and "c" in p.status["handledFailures"]
    assert created_pods(p) == []  # node-1 will exit 0: a replacement would wait for nobody
    alone = plan(job(), {**trained, **p.status}, [STORE], NOW, RULES)
    assert created_pods(alone) == ["j-node-0", "j-node-1"]  # none left to finish: they do
    # Before the last step it is a failure like any other: with no budget, the job fails.
    stepping = {**RUNNING, "progress": {"step": 65, "totalSteps": 66}}
    q = plan(job(backoffLimit=0), stepping, [STORE, crashed, pod(1)], NOW, RULES)
    assert q.status["phase"] == "Failed" and q.status["reason"] == "BackoffLimitExceeded"


def test_a_node_lost_before_its_peer_finished_is_not_replaced_once_the_peer_is_done() -> None:
    # node-1 was deleted and counted; its replacement waits out the backoff when node-0 ends.
    status = {**RUNNING, "restarts": 2, "handledFailures": ["l"],
              "lastFailureTime": "2026-01-01T11:59:55Z"}  # fmt: skip
    p = plan(job(), status, [STORE, finished(0)], NOW, RULES)
    assert created_pods(p) == [] and p.status["restarts"] == 2
    assert p.status["phase"] == "Succeeded"
    assert p.status["conditions"][-1]["message"] == (
        "j-node-1 was lost before j-node-0 completed training, and not replaced"
    )


def test_a_replacement_failing_after_a_peer_succeeded_is_no_failure() -> None:
    """As observed on a real kubelet: the replacement cannot join the closed rendezvous."""
    status = {**RUNNING, "restarts": 3}
    failing = aged(pod(1, "Failed", uid="r", exit_code=1), created="2026-01-01T11:59:55Z")
    p = plan(job(backoffLimit=3), status, [STORE, finished(0), failing], NOW, RULES)
    assert p.status["phase"] == "Succeeded" and p.status["restarts"] == 3
    assert "BackoffLimitExceeded" not in [r for _, r, _ in p.events]
    assert p.status["conditions"][-1]["message"] == (
        "j-node-1 was lost after j-node-0 completed training"
    )
    assert created_pods(p) == []


def test_the_others_get_a_bounded_time_to_finish_from_the_first_success() -> None:
    observed = [STORE, finished(0), aged(pod(1))]
    grace_30 = dataclasses.replace(RULES, completion_grace_s=30)
    wait = plan(job(), RUNNING, observed, NOW, grace_30)
    assert wait.status["phase"] == "Running" and wait.delete == [] and created_pods(wait) == []
    assert wait.status["conditions"][-1]["reason"] == "NodesCompleting"
    assert wait.requeue_after == pytest.approx(20)  # finishedAt + 30 s - NOW
    due = NOW + dt.timedelta(seconds=20)
    done = plan(
        job(),
        {**RUNNING, **wait.status},
        observed,
        due,
        grace_30,
    )
    assert done.status["phase"] == "Succeeded"
    assert sorted(done.delete) == ["j-node-1", "j-rdzv"]
    assert done.status["conditions"][-1]["message"] == (
        "j-node-1 did not finish within 30s after j-node-0 completed training and was stopped"
    )
    # A node lost while the job waits was lost after the first success, even once it is gone.
    waited = {**RUNNING, **wait.status}
    gone = plan(job(), waited, [STORE, finished(0)], NOW, grace_30)
    assert gone.status["conditions"][-1]["message"] == (
        "j-node-1 was lost after j-node-0 completed training"
    )
    # The first success counts: a later one does not extend the wait.
    three = [*observed, finished(2, at="2026-01-01T12:00:15Z")]
    assert plan(job(nodes=3), RUNNING, three, due, grace_30).status["phase"] == "Succeeded"


def test_view_reads_finished_at_and_the_disruption_target_condition() -> None:
    body = {
        "metadata": {"name": "j-node-0", "uid": "u", "labels": {render.LABEL_INDEX: "0"}},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"},
            ],
            "containerStatuses": [
                {
                    "name": "trainer",
                    "state": {"terminated": {"exitCode": 0, "finishedAt": "2026-01-01T11:59:50Z"}},
                }
            ],
        },
    }
    v = views.view(body)
    assert (v.finished, v.disrupted, v.ready) == (
        "2026-01-01T11:59:50Z",
        "EvictionByEvictionAPI",
        True,
    )
    body["status"]["conditions"][1]["status"] = "False"
    assert views.view(body).disrupted == ""


def test_the_status_names_the_image_the_node_pods_run_and_keeps_it_once_they_are_gone() -> None:
    body = {
        "metadata": {"name": "j-node-0", "uid": "u", "labels": {render.LABEL_INDEX: "0"}},
        "spec": {
            "containers": [{"name": "sidecar", "image": "s:1"}, {"name": "trainer", "image": "t:2"}]
        },
    }
    assert views.view(body).image == "t:2"
    assert views.view({"metadata": {"name": "j-store"}}).image == ""

    pods = [dataclasses.replace(STORE, image=""), pod(1, image="t:2"), pod(0, image="t:2")]
    assert plan(job(nodes=2), RUNNING, pods, NOW, RULES).status["image"] == "t:2"
    # No node pod left (a suspended job, or one whose pods were deleted): the field is not
    # written, so the merge patch leaves the image the status already names.
    assert "image" not in plan(job(nodes=2, suspend=True), RUNNING, [], NOW, RULES).status
    # An image no pod ran (a name no machine can pull) is not kept.
    pulling = [STORE, pod(0, "Pending", image="typo:1"), pod(1, "Pending", image="typo:1")]
    assert "image" not in plan(job(nodes=2), RUNNING, pulling, NOW, RULES).status


def test_a_replaced_pod_runs_the_image_its_job_ran_not_a_newer_operator_default() -> None:
    def images(p: draft.Plan) -> dict[str, str]:
        return {
            o["metadata"]["name"]: o["spec"]["containers"][0]["image"]
            for o in p.create
            if o["kind"] == "Pod"
        }

    ran = {**RUNNING, "image": "trainer:old"}  # CFG, the operator's default now: trainer:test
    p = plan(job(nodes=2), ran, [STORE, pod(0, image="trainer:old")], NOW, RULES)
    assert images(p) == {"j-node-1": "trainer:old"}
    lost_store = plan(job(nodes=2), ran, [pod(0), pod(1)], NOW, RULES)
    assert images(lost_store) == {"j-rdzv": "trainer:old"}
    # The spec's image wins; a job none of whose pods ran gets the operator's default.
    mine = plan(job(nodes=2, image="mine:1"), ran, [STORE, pod(0)], NOW, RULES)
    assert images(mine) == {"j-node-1": "mine:1"}
    assert set(images(plan(job(nodes=2), RUNNING, [], NOW, RULES)).values()) == {"trainer:test"}


def test_a_disruption_is_counted_apart_and_never_spends_the_backoff_limit() -> None:
    status = {**RUNNING, "restarts": 1, "lastFailureTime": "2026-01-01T11:00:00Z"}
    evicted = aged(pod(0, uid="e"), disrupted="EvictionByEvictionAPI")  # deletion not seen yet
    p = plan(job(backoffLimit=1), status, [STORE, evicted, aged(pod(1))], NOW, RULES)
    assert p.status["restarts"] == 1 and p.status["disruptions"] == 1
    assert p.status["phase"] != "Failed"
    ((kind, reason, text),) = p.events
    assert (kind, reason) == ("Warning", "Disruption") and "EvictionByEvictionAPI" in text
    # Seen again while it is deleted, and once gone: not counted twice; then recreated at once.
    again = {**status, **p.status}
    seen = [STORE, aged(evicted, deleting=True), aged(pod(1))]
    going = plan(job(backoffLimit=1), again, seen, NOW, RULES)
    assert going.status["restarts"] == 1 and "disruptions" not in going.status
    gone = plan(job(backoffLimit=1), again, [STORE, aged(pod(1))], NOW, RULES)
    assert created_pods(gone) == ["j-node-0"]
    # Its peer failing because of it follows the disruption: no restart either.
    peer = aged(pod(1, "Failed", uid="s", exit_code=1))
    after = plan(job(backoffLimit=1), again, [STORE, peer], NOW, RULES)
    assert after.status["restarts"] == 1 and after.status["phase"] != "Failed"


def test_a_node_pod_gone_before_its_end_was_seen_is_a_disruption_counted_once() -> None:
    """Seen running (status.seenRunning), then gone, neither deleted by the operator nor seen
    ending: deleted while no operator replica led (a failover, an upgrade), or at once
    (grace period 0). Seen on kind: a node pod deleted as the leader's pod was, replaced by
    the next leader, counted nowhere. Why it went is not known: a disruption, not a restart."""
    seen = plan(job(backoffLimit=0), RUNNING, [STORE, pod(0), pod(1)], NOW, RULES)
    running = {"j-node-0": "uid-j-node-0-Running", "j-node-1": "uid-j-node-1-Running"}
    assert seen.status["seenRunning"] == running
    after = {**RUNNING, **seen.status}
    p = plan(job(backoffLimit=0), after, [STORE, pod(0)], NOW, RULES)
    assert p.status["disruptions"] == 1 and p.status["restarts"] == 0
    assert p.status["phase"] != "Failed" and created_pods(p) == ["j-node-1"]
    ((kind, _, text),) = [e for e in p.events if e[1] == "Disruption"]
    assert kind == "Warning" and text.startswith(
        "j-node-1 was deleted before the operator saw it go"
    )
    assert [i["kind"] for i in p.status["incidents"]] == ["Disruption"]
    assert p.status["seenRunning"] == {"j-node-0": "uid-j-node-0-Running"}
    # Counted once: the next look (its replacement not up yet, or up) counts nothing.
    again = {**after, **p.status}
    for pods in ([STORE, pod(0)], [STORE, pod(0), pod(1, uid="new")]):
        q = plan(job(backoffLimit=0), again, pods, NOW, RULES)
        assert "disruptions" not in q.status and q.status["restarts"] == 0
    # Nor from the status the look before it wrote: its uid is handled.
    assert plan(job(), {**after, "handledFailures": p.status["handledFailures"]},
                [STORE, pod(0)], NOW, RULES).status.get("disruptions") is None  # fmt: skip


def test_a_pod_the_operator_deleted_itself_is_not_counted_once_gone() -> None:
    status = {**RUNNING, "seenRunning": {"j-node-0": "a", "j-node-1": "b"}}
    elastic = {"nodes": 1, "minNodes": 1, "maxNodes": 2}
    down = plan(job(**elastic), status, [STORE, pod(0, uid="a"), pod(1, uid="b")], NOW, RULES)
    assert down.delete == ["j-node-1"]
    gone = plan(job(**elastic), {**status, **down.status}, [STORE, pod(0, uid="a")], NOW, RULES)
    assert "disruptions" not in gone.status and gone.status["restarts"] == 0
    assert [e for e in gone.events if e[1] == "Disruption"] == []


def test_a_pod_that_failed_after_a_node_pressure_eviction_is_a_disruption() -> None:
    evicted = aged(pod(1, "Failed", uid="k", exit_code=137), disrupted="TerminationByKubelet")
    p = plan(job(backoffLimit=0), RUNNING, [STORE, aged(pod(0)), evicted], NOW, RULES)
    assert p.status["restarts"] == 0 and p.status["disruptions"] == 1
    assert p.delete == ["j-node-1"] and p.status["phase"] != "Failed"


def test_suspend_deletes_pods_and_resume_recreates_them() -> None:
    status = {"phase": "Running", "startTime": "2026-01-01T11:00:00Z"}
    s = plan(job(suspend=True), status, [STORE, pod(0), pod(1)], NOW, RULES)
    assert sorted(s.delete) == ["j-node-0", "j-node-1", "j-rdzv"]
    assert s.status["phase"] == "Suspended"
    r = plan(job(), {**status, **s.status}, [], NOW, RULES)
    assert created_pods(r) == ["j-rdzv", "j-node-0", "j-node-1"]
    assert any(reason == "Resumed" for _, reason, _ in r.events)


def test_a_job_that_trains_no_more_shows_no_time_left() -> None:
    progress = {"step": 30, "totalSteps": 90, "estimatedRemainingSeconds": 60, "eta": "1m00s"}
    running = {"phase": "Running", "startTime": EARLIER, "progress": progress}
    assert "progress" not in plan(job(), running, [STORE, pod(0), pod(1)], NOW, RULES).status
    suspended = plan(job(suspend=True), running, [STORE, pod(0), pod(1)], NOW, RULES).status
    assert suspended["phase"] == "Suspended"
    assert suspended["progress"] == {**progress, "estimatedRemainingSeconds": None, "eta": None}
    failed = plan(job(activeDeadlineSeconds=60), running, [STORE, pod(0), pod(1)], NOW, RULES)
    assert failed.status["progress"]["estimatedRemainingSeconds"] is None
    assert failed.status["progress"]["eta"] is None


def test_deadline_fails_the_job() -> None:
    status = {"phase": "Running", "startTime": "2026-01-01T11:00:00Z"}
    p = plan(job(activeDeadlineSeconds=60), status, [STORE, pod(0), pod(1)], NOW, RULES)
    assert p.status["phase"] == "Failed"
    assert p.status["conditions"][-1]["reason"] == "DeadlineExceeded"


def test_ttl_deletes_a_finished_job_only_when_due() -> None:
    done = {"phase": "Succeeded", "completionTime": "2026-01-01T11:59:00Z"}
    assert not plan(job(ttlSecondsAfterFinished=120), done, [], NOW, RULES).delete_job
    assert plan(job(ttlSecondsAfterFinished=30), done, [], NOW, RULES).delete_job


def test_view_reads_exit_codes_and_readiness_from_a_pod_body() -> None:
    body = {
        "metadata": {
            "name": "j-node-1",
            "uid": "u",
            "labels": {render.LABEL_ROLE: "worker", render.LABEL_INDEX: "1"},
        },
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {"name": "trainer", "state": {"terminated": {"exitCode": 3, "reason": "Error"}}}
            ],
        },
    }
    v = views.view(body)
    assert (v.index, v.phase, v.exit_code, v.ready) == (1, "Failed", 3, False)


def on(x: views.PodView, machine: str) -> views.PodView:
    return aged(x, machine=machine)


def machine(name: str, ready: str, since: str = "2026-01-01T11:59:20Z") -> views.MachineView:
    return views.MachineView(name, ready, since)  # since: 40 s before NOW by default


def test_pods_on_a_machine_not_ready_past_the_grace_are_deleted_at_once_as_a_disruption() -> None:
    observed = [on(STORE, "m1"), on(pod(0, uid="a"), "m1"), on(pod(1), "m2")]
    machines = {"m1": machine("m1", "Unknown"), "m2": machine("m2", "True")}
    p = plan(job(backoffLimit=0), RUNNING, observed, NOW, RULES, machines=machines)
    assert sorted(p.force) == ["j-node-0", "j-rdzv"] and p.delete == []
    assert p.status["disruptions"] == 1 and p.status["restarts"] == 0  # the store counts nothing
    assert p.status["phase"] == "Restarting"
    cond = p.status["conditions"][-1]
    assert cond["reason"] == "NodeLost" and "machine m1" in cond["message"]
    assert [r for _, r, _ in p.events if r in ("NodeLost", "StoreLost")] == [
        "StoreLost",
        "NodeLost",
    ]
    # Seen again before the watch shows them gone: nothing twice; once gone, recreated.
    again = {**RUNNING, **p.status}
    q = plan(job(backoffLimit=0), again, observed, NOW, RULES, machines=machines)
    assert q.force == [] and "disruptions" not in q.status
    # A pod the operator deleted itself (say, scaled down) would stay Terminating there.
    stuck = aged(on(pod(1, uid="b"), "m1"), deleting=True)
    mine = {**RUNNING, "handledFailures": ["b"]}
    r = plan(job(nodes=1), mine, [STORE, stuck], NOW, RULES, machines=machines)
    assert r.force == ["j-node-1"] and "disruptions" not in r.status
    gone = plan(job(backoffLimit=0), again, [on(pod(1), "m2")], NOW, RULES, machines=machines)
    assert created_pods(gone) == ["j-rdzv", "j-node-0"]


def test_a_machine_not_ready_for_less_than_the_grace_is_waited_for() -> None:
    observed = [STORE, on(pod(0), "m1"), on(pod(1), "m2")]
    machines = {"m1": machine("m1", "False", since="2026-01-01T11:59:50Z")}  # 10 s ago
    p = plan(job(), RUNNING, observed, NOW, LOST_30, machines=machines)
    assert p.force == [] and "disruptions" not in p.status
    assert p.requeue_after == pytest.approx(20)


def test_a_silent_machine_loses_its_pods_while_its_node_still_says_ready() -> None:
    """Its kubelet stopped renewing its Lease 35 s ago (the controller marks it silent): the
    Node is still Ready (kube-controller-manager waits 50 s), the pods go now."""
    observed = [STORE, on(pod(0, uid="a"), "m1"), on(pod(1), "m2")]
    silent = views.MachineView("m1", "True", "2026-01-01T10:00:00Z", "2026-01-01T11:59:25Z")
    machines = {"m1": silent, "m2": machine("m2", "True")}
    p = plan(job(), RUNNING, observed, NOW, LOST_30, machines=machines)
    assert p.force == ["j-node-0"] and p.status["disruptions"] == 1
    (msg,) = [m for _, r, m in p.events if r == "NodeLost"]
    assert "on machine m1, which has sent no heartbeat (its Lease) for 35s" in msg
    # Once gone, recreated, but not where the scheduler would still put it (its Node is Ready).
    gone = plan(job(), {**RUNNING, **p.status}, [STORE, on(pod(1), "m2")], NOW, LOST_30,
                machines=machines)  # fmt: skip
    (new,) = [o for o in gone.create if o["metadata"]["name"] == "j-node-0"]
    terms = new["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    avoid = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["m1"]}
    assert terms["nodeSelectorTerms"] == [{"matchExpressions": [avoid]}]


def test_a_machine_is_silent_after_the_grace_and_never_before_two_missed_renewals() -> None:
    heard = {"quiet": 100.0, "fresh": 125.0, "edge": 110.0}
    assert lost_machines.silent_machines(heard, now=140.0, grace_s=30) == {"quiet", "edge"}
    assert lost_machines.silent_machines(heard, now=139.0, grace_s=30) == {"quiet"}
    # A grace of 0 acts on a NotReady machine at once, but silence needs two missed renewals.
    assert lost_machines.silent_machines(heard, now=140.0, grace_s=0) == {"quiet", "edge"}
    assert lost_machines.silent_machines({"m": 100.0}, now=119.0, grace_s=0) == set()
    # The operator's own tick, due 2 s after the last, came 100 s late: it was the one stopped
    # (its machine frozen and back), so the machines are heard afresh, not lost.
    assert lost_machines.stalled(last=100.0, now=202.0, tick_s=2.0)
    assert not lost_machines.stalled(last=100.0, now=105.0, tick_s=2.0)  # a busy loop, not a stop


def test_machine_view_reads_the_ready_condition() -> None:
    body = {
        "metadata": {"name": "m1"},
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {
                    "type": "Ready",
                    "status": "Unknown",
                    "lastTransitionTime": "2026-01-01T11:59:20Z",
                },
            ]
        },
    }
    assert views.machine_view(body) == machine("m1", "Unknown")
    assert views.machine_view({"metadata": {"name": "new"}}).ready == "Unknown"
    pod_body = {"metadata": {"name": "j-node-0"}, "spec": {"nodeName": "m1"}, "status": {}}
    assert views.view(pod_body).machine == "m1"


# A job Running with both nodes ready since 11:00, its step last seen moving at 11:50.
RUNNING_SINCE = "2026-01-01T11:00:00Z"
STEPPING = {
    "phase": "Running",
    "reason": "AllNodesRunning",
    "startTime": RUNNING_SINCE,
    "conditions": [
        {"type": "Running", "status": "True", "lastTransitionTime": RUNNING_SINCE},
    ],
    "progress": {"step": 57, "totalSteps": 100, "updatedAt": "2026-01-01T11:50:00Z"},
    "lastStepTime": "2026-01-01T11:50:00Z",
}


def stall_plan(status: dict[str, Any], at: dt.datetime = NOW, **spec: Any) -> draft.Plan:
    return plan(job(**spec), status, [STORE, pod(0), pod(1)], at, RULES)


def test_a_job_whose_step_stops_moving_is_restarted_at_its_progress_deadline() -> None:
    waiting = stall_plan(STEPPING, progressDeadlineSeconds=900)  # 600 s quiet of 900
    assert waiting.delete == [] and waiting.status["phase"] == "Running"
    assert waiting.requeue_after == 300  # looked at again when it is due
    p = stall_plan(STEPPING, progressDeadlineSeconds=600)
    assert p.delete == ["j-node-0", "j-node-1"]  # the nodes; the store stays
    assert p.status["phase"] == "Restarting" and p.status["reason"] == "Stalled"
    assert p.status["disruptions"] == 1 and p.status["restarts"] == 0
    assert p.status["stalledAtStep"] == 57
    (message,) = [m for _, r, m in p.events if r == "Stalled"]
    assert "no training step for 600s at step 57 (progressDeadlineSeconds 600)" in message
    # Stalled again at the same step: that one counts against backoffLimit.
    again = stall_plan({**STEPPING, "stalledAtStep": 57}, progressDeadlineSeconds=600)
    assert again.status["restarts"] == 1 and "disruptions" not in again.status
    spent = stall_plan(
        {**STEPPING, "stalledAtStep": 57}, progressDeadlineSeconds=600, backoffLimit=0
    )
    assert spent.status["phase"] == "Failed" and spent.status["reason"] == "Stalled"


def test_the_default_deadline_is_ten_minutes_or_ten_step_times() -> None:
    assert stall.progress_deadline_s(None, None) == 600
    slow = {"step": 50, "totalSteps": 100, "estimatedRemainingSeconds": 5000}  # 100 s a step
    assert stall.progress_deadline_s(None, slow) == 1000
    assert stall.progress_deadline_s(0, slow) == 0 and stall.progress_deadline_s(30, slow) == 30
    assert stall_plan(STEPPING).status["reason"] == "Stalled"  # 600 s quiet: the default's floor


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"progressDeadlineSeconds": 0}, "the deadline is off"),
        ({"progress": {**STEPPING["progress"], "heldAtStep": 57}}, "held"),
        ({"progress": {**STEPPING["progress"], "step": 100}}, "past the last step"),
        ({"lastStepTime": "2026-01-01T11:55:00Z"}, "the step moved 5 min ago"),
        ({"reason": "NodesNotReady"}, "not every node ready"),
        (
            {
                "conditions": [
                    {
                        "type": "Running",
                        "status": "True",
                        "lastTransitionTime": "2026-01-01T11:58:00Z",
                    }
                ]
            },
            "Running again for 2 min only",
        ),
    ],
)
def test_no_stall_is_said_where_no_step_is_due(change: dict[str, Any], why: str) -> None:
    spec = {"progressDeadlineSeconds": change.pop("progressDeadlineSeconds", 600)}
    p = stall_plan({**STEPPING, **change}, **spec)
    assert p.delete == [] and p.status.get("reason") != "Stalled", why


def test_a_job_without_a_report_since_it_became_running_is_starting_not_stalled() -> None:
    silent = {k: v for k, v in STEPPING.items() if k not in ("progress", "lastStepTime")}
    own = {"command": ["python", "train.py"], "progressDeadlineSeconds": 60}
    assert stall_plan(silent, **own).delete == []
    assert stall_plan(silent, progressDeadlineSeconds=60).delete == []  # loading its data
    # The first report after a restart starts the clock even at the step it stalled at.
    again = {**STEPPING, "lastStepTime": "2026-01-01T10:00:00Z"}  # before it became Running
    assert stall_plan(again, progressDeadlineSeconds=60).delete == []
    report = {**STEPPING["progress"], "updatedAt": "2026-01-01T11:59:00Z"}  # the same step 57
    p = plan(
        job(progressDeadlineSeconds=60), again, [STORE, pod(0), pod(1)], NOW, RULES,
        progress=report,
    )  # fmt: skip
    assert p.status["lastStepTime"] == "2026-01-01T12:00:00Z"


def test_a_new_step_in_a_report_restarts_the_clock() -> None:
    report = {**STEPPING["progress"], "step": 58, "updatedAt": "2026-01-01T12:00:00Z"}
    p = plan(
        job(progressDeadlineSeconds=600), STEPPING, [STORE, pod(0), pod(1)], NOW, RULES,
        progress=report,
    )  # fmt: skip
    assert p.status["lastStepTime"] == "2026-01-01T12:00:00Z" and p.delete == []


def test_pods_of_an_earlier_job_of_the_same_name_are_neither_counted_nor_replaced() -> None:
    """Seen on kind: `kubectl delete ddpjob digits` then at once `kubectl apply` of a new
    digits: the garbage collector had not deleted the earlier job's pods yet, and the new job
    took the earlier one's Succeeded pod for its own and Succeeded without training. Pods
    another job controls are not the job's; their names wait until they are gone."""
    earlier = [
        pod(0, "Succeeded", exit_code=0, owner="u-0"),
        dataclasses.replace(pod(1, owner="u-0"), deleting=True),
        pod(-1, role=render.ROLE_STORE, owner="u-0"),
    ]
    mine, foreign = views.split_by_owner(earlier, "u-1")
    assert mine == [] and foreign == earlier
    p = plan(job(), {}, mine, NOW, RULES, foreign=foreign)
    assert p.status["phase"] == "Pending" and created_pods(p) == []
    assert [o["metadata"]["name"] for o in p.create] == ["j-rdzv", "j"]  # the Services
    cond = next(c for c in p.status["conditions"] if c["type"] == "Pending")
    assert (cond["reason"], cond["message"]) == (
        "WaitingForNodes",
        "starting 2 nodes; waiting for j-node-0, j-node-1 and the store j-rdzv, left by an"
        " earlier DDPJob named j, to go",
    )
    assert [r for t, r, _ in p.events if t == "Warning"] == []  # they go by themselves
    # node-0's name is free again: its pod is created; node-1's still waits
    p = plan(job(), p.status, [], NOW, RULES, foreign=foreign[1:2])
    assert created_pods(p) == ["j-rdzv", "j-node-0"]


def test_a_pod_no_job_controls_that_holds_a_name_is_said_with_the_fix() -> None:
    orphan = pod(0, owner="")  # `kubectl delete ddpjob j --cascade=orphan` left it
    p = plan(job(), {}, [], NOW, RULES, foreign=[orphan])
    assert created_pods(p) == ["j-rdzv", "j-node-1"] and p.status["phase"] == "Pending"
    cond = next(c for c in p.status["conditions"] if c["type"] == "Pending")
    expected = (
        "j-node-0 exists but no DDPJob controls it (orphaned, or made by hand), and j needs its"
        " name: delete it (kubectl delete pod j-node-0), or give the DDPJob another name"
    )
    assert (p.status["reason"], cond["message"]) == ("PodNameTaken", expected)
    assert [(t, r, m) for t, r, m in p.events if t == "Warning"] == [
        ("Warning", "PodNameTaken", expected)
    ]
    again = plan(job(), p.status, [pod(1, "Pending")], NOW, RULES, foreign=[orphan])
    assert again.status["reason"] == "PodNameTaken"
    assert [r for t, r, _ in again.events if t == "Warning"] == []  # said once


def test_view_reads_the_controlling_owner() -> None:
    ref = {"apiVersion": "ddp.dev/v1alpha1", "kind": "DDPJob", "name": "j", "uid": "u-1"}
    body: dict[str, Any] = {"metadata": {"name": "j-node-0", "ownerReferences": [ref]}}
    assert views.view(body).owner == ""  # owned, not controlled (the client's ConfigMaps)
    ref["controller"] = True
    assert views.view(body).owner == "u-1"
