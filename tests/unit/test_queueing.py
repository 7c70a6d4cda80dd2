"""Kueue, pure: the Workload of a queued job, Kueue's decisions as the planner reads them, and
the status applies the operator makes as Kueue's job reconciler would."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from ddpjobs import ddpjob

from ddp_api.ddpjob import DDPJob
from ddp_operator import informer, queueing, render
from ddp_operator.planner import views
from ddp_operator.planner.plan import PlanSettings, plan
from ddp_operator.settings import Settings

NOW = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
STAMP = "2026-01-01T12:00:00Z"
CFG = render.OperatorConfig(default_image="trainer:test")
RULES = PlanSettings(CFG)
Q = queueing.State


def job(labels: dict[str, str] | None = None, **spec: Any) -> DDPJob:
    return ddpjob(
        {"nodes": 2, "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}, **spec},
        labels={queueing.QUEUE_LABEL: "team", **(labels or {})},
    )


def workload(*conditions: dict[str, Any], admission: dict[str, Any] | None = None) -> dict:
    status: dict[str, Any] = {"conditions": [dict(c) for c in conditions]}
    if admission is not None:
        status["admission"] = admission
    return {
        "metadata": {
            "name": "ddpjob-j-abcde",
            "namespace": "ns",
            "uid": "w-1",
            "resourceVersion": "42",
            "generation": 1,
        },
        "spec": {"queueName": "team", "podSets": [{"name": "node", "count": 2}]},
        "status": status,
    }


def cond(ctype: str, status: str = "True", reason: str = "R", message: str = "m") -> dict:
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2025-12-31T00:00:00Z",
    }


ADMISSION = {
    "clusterQueue": "cq",
    "podSetAssignments": [
        {"name": "node", "count": 2, "flavors": {"cpu": "big", "memory": "big"}},
    ],
}
ADMITTED = workload(
    cond("QuotaReserved", reason="QuotaReserved"),
    cond("Admitted", reason="Admitted", message="The workload is admitted"),
    admission=ADMISSION,
)
EVICTED = workload(
    cond("QuotaReserved", reason="QuotaReserved"),
    cond("Admitted", reason="Admitted"),
    cond("Evicted", reason="Preempted", message="Preempted to accommodate a workload (UID: x)"),
    admission=ADMISSION,
)


def worker(j: DDPJob) -> dict[str, Any]:
    return render.render_worker(j, 0, 0, CFG)


# -- the Workload ---------------------------------------------------------------------------------
def test_the_workload_is_one_pod_set_of_nodes_pods_owned_by_the_job() -> None:
    j = job(template={"priorityClassName": "high", "nodeSelector": {"pool": "a"}})
    wl = queueing.render_workload(j, worker(j), "team", 1000, render.LABEL_JOB)
    assert wl["apiVersion"] == "kueue.x-k8s.io/v1beta2" and wl["kind"] == "Workload"
    assert wl["metadata"]["name"] == queueing.workload_name(j)
    assert wl["metadata"]["labels"][render.LABEL_JOB] == "j"
    owner = wl["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "DDPJob",
        "j",
        "u-1",
        True,
    )
    assert wl["spec"]["queueName"] == "team"
    assert wl["spec"]["priorityClassRef"] == {
        "group": "scheduling.k8s.io",
        "kind": "PriorityClass",
        "name": "high",
    }
    assert wl["spec"]["priority"] == 1000
    (ps,) = wl["spec"]["podSets"]
    assert (ps["name"], ps["count"]) == ("node", 2) and "minCount" not in ps
    spec = ps["template"]["spec"]
    assert spec["containers"][0]["resources"]["requests"] == {"cpu": "2", "memory": "1Gi"}
    assert "env" not in spec["containers"][0]
    assert spec["nodeSelector"] == {"pool": "a"} and spec["priorityClassName"] == "high"


def test_the_workload_name_is_stable_per_job_and_differs_for_a_new_job_of_that_name() -> None:
    a, b = job(), job()
    assert queueing.workload_name(a) == queueing.workload_name(b)
    other = job()
    other.metadata["uid"] = "u-2"
    assert queueing.workload_name(other) != queueing.workload_name(a)
    assert queueing.workload_name(a).startswith("ddpjob-j-")


def test_an_elastic_job_may_be_admitted_with_min_nodes() -> None:
    j = job(nodes=3, minNodes=1, maxNodes=4)
    (ps,) = queueing.pod_sets(j, worker(j))
    assert (ps["count"], ps["minCount"]) == (3, 1)


def test_the_pod_sets_follow_spec_nodes_only_while_no_quota_is_reserved() -> None:
    j = job(nodes=3, minNodes=1, maxNodes=4)
    queued = workload(cond("QuotaReserved", "False", "Pending"))
    patch = queueing.resize(j, queued)
    assert patch is not None
    assert (patch["spec"]["podSets"][0]["count"], patch["spec"]["podSets"][0]["minCount"]) == (3, 1)
    assert queueing.resize(j, ADMITTED) is None
    same = job(nodes=2)
    assert queueing.resize(same, queued) is None


# -- what Kueue decided ---------------------------------------------------------------------
def test_no_workload_or_no_reservation_is_queued_with_kueues_reason_and_message() -> None:
    assert queueing.admission(None, "team").state == Q.QUEUED
    msg = "couldn't assign flavors to pod set node: insufficient quota for cpu in flavor big"
    adm = queueing.admission(workload(cond("QuotaReserved", "False", "Pending", msg)), "team")
    assert (adm.state, adm.reason, adm.message) == (Q.QUEUED, "Pending", msg)


def test_admitted_reads_the_cluster_queue_count_and_flavors() -> None:
    adm = queueing.admission(ADMITTED, "team")
    assert (adm.state, adm.cluster_queue, adm.count, adm.flavors) == (
        Q.ADMITTED,
        "cq",
        2,
        ("big",),
    )


def test_quota_reserved_but_not_admitted_is_still_queued() -> None:
    wl = workload(cond("QuotaReserved", reason="QuotaReserved"), admission=ADMISSION)
    assert queueing.admission(wl, "team").state == Q.QUEUED


def test_evicted_wins_over_admitted() -> None:
    adm = queueing.admission(EVICTED, "team")
    assert (adm.state, adm.reason) == (Q.EVICTED, "Preempted")


def test_flavors_add_node_labels_and_tolerations_to_the_pods() -> None:
    toleration = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    flavors = {"big": {"spec": {"nodeLabels": {"pool": "big"}, "tolerations": [toleration]}}}
    adm = queueing.with_flavors(queueing.admission(ADMITTED, "team"), flavors)
    j = job(template={"nodeSelector": {"zone": "z1"}})
    pod = render.render_worker(queueing.admitted_job(j, adm), 0, 0, CFG)
    assert pod["spec"]["nodeSelector"] == {"zone": "z1", "pool": "big"}
    assert pod["spec"]["tolerations"] == [toleration]


def test_partial_admission_runs_only_the_admitted_count() -> None:
    admission = {**ADMISSION, "podSetAssignments": [{"name": "node", "count": 1}]}
    wl = workload(cond("QuotaReserved"), cond("Admitted"), admission=admission)
    j = job(nodes=3, minNodes=1, maxNodes=4)
    p = plan(j, {}, [], NOW, RULES, admission=queueing.admission(wl, "team"))
    assert [o["metadata"]["name"] for o in p.create if o["kind"] == "Pod"] == [
        "j-rdzv",
        "j-node-0",
    ]


# -- the planner --------------------------------------------------------------------------------
def test_a_queued_job_has_no_pods_and_says_which_queue_it_waits_in() -> None:
    msg = "insufficient quota for cpu in flavor big"
    adm = queueing.admission(workload(cond("QuotaReserved", "False", "Pending", msg)), "team")
    p = plan(job(), {}, [], NOW, RULES, admission=adm)
    assert p.create == []
    assert p.status["phase"] == "Queued" and p.status["queue"] == "team"
    admitted = next(c for c in p.status["conditions"] if c["type"] == "Admitted")
    assert admitted["status"] == "False" and msg in admitted["message"]
    assert [e[1] for e in p.events] == ["Queued"]


def test_admission_starts_the_job_with_an_event_naming_the_cluster_queue() -> None:
    status = {"phase": "Queued", "queue": "team"}
    p = plan(job(), status, [], NOW, RULES, admission=queueing.admission(ADMITTED, "team"))
    assert [o["metadata"]["name"] for o in p.create if o["kind"] == "Pod"] == [
        "j-rdzv",
        "j-node-0",
        "j-node-1",
    ]
    assert p.status["clusterQueue"] == "cq" and p.status["admissions"] == 1
    assert ("Normal", "Admitted") in [(e[0], e[1]) for e in p.events]
    admitted = next(c for c in p.status["conditions"] if c["type"] == "Admitted")
    assert admitted["status"] == "True" and "cq" in admitted["message"]
    again = plan(
        job(),
        {**status, **p.status},
        [],
        NOW,
        RULES,
        admission=queueing.admission(ADMITTED, "team"),
    )
    assert "Admitted" not in [e[1] for e in again.events]


def running(i: int) -> views.PodView:
    return views.PodView(
        name=render.worker_name("j", i),
        uid=f"p{i}",
        role=render.ROLE_WORKER,
        index=i,
        phase="Running",
        ready=True,
        deleting=False,
    )


def test_eviction_deletes_the_pods_without_counting_a_restart_then_readmission_resumes() -> None:
    status = {"phase": "Running", "queue": "team", "clusterQueue": "cq", "admissions": 1}
    pods = [running(0), running(1)]
    p = plan(job(), status, pods, NOW, RULES, admission=queueing.admission(EVICTED, "team"))
    assert sorted(p.delete) == ["j-node-0", "j-node-1"]
    assert p.status["phase"] == "Queued" and p.status["restarts"] == 0
    assert p.status["clusterQueue"] is None
    (event,) = p.events
    assert event[:2] == ("Warning", "Evicted") and "Preempted" in event[2]
    condition = next(c for c in p.status["conditions"] if c["type"] == "Queued")
    assert condition["reason"] == "Preempted"
    # The pods are gone; Kueue admits it again: a Readmitted event, pods recreated.
    status = planner_status(status, p.status)
    again = plan(job(), status, [], NOW, RULES, admission=queueing.admission(ADMITTED, "team"))
    assert again.events[0][1] == "Readmitted"
    assert again.status["admissions"] == 2
    assert len([o for o in again.create if o["kind"] == "Pod"]) == 3


def planner_status(old: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = dict(old)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def test_a_job_without_admission_runs_as_before() -> None:
    p = plan(job(), {}, [], NOW, RULES)
    assert "queue" not in p.status and p.status["phase"] == "Pending"


# -- the status applies ----------------------------------------------------------------------
def test_release_clears_the_admission_as_kueues_job_reconciler_does() -> None:
    body = queueing.release(EVICTED, STAMP)
    assert body is not None
    assert body["metadata"]["resourceVersion"] == "42"  # a conflict if it changed meanwhile
    status = body["status"]
    assert "admission" not in status
    conds = {c["type"]: c for c in status["conditions"]}
    assert (conds["QuotaReserved"]["status"], conds["QuotaReserved"]["reason"]) == (
        "False",
        "Pending",
    )
    assert (conds["Admitted"]["status"], conds["Admitted"]["reason"]) == ("False", "NoReservation")
    assert (conds["Requeued"]["status"], conds["Requeued"]["reason"]) == ("True", "Preempted")
    assert conds["Evicted"]["status"] == "True"  # Kueue's own to clear
    assert queueing.release(ADMITTED, STAMP) is None
    released = {**EVICTED, "status": status}
    assert queueing.release(released, STAMP) is None


def test_finish_marks_the_workload_finished_once() -> None:
    body = queueing.finish(ADMITTED, True, "all 2 nodes exited 0", STAMP)
    assert body is not None
    conds = {c["type"]: c for c in body["status"]["conditions"]}
    assert (conds["Finished"]["status"], conds["Finished"]["reason"]) == ("True", "Succeeded")
    assert body["status"]["admission"] == ADMISSION  # kept, as Kueue's Finish keeps it
    done = {**ADMITTED, "status": body["status"]}
    assert queueing.finish(done, True, "again", STAMP) is None
    failed = queueing.finish(ADMITTED, False, "backoff", STAMP)
    assert failed is not None
    assert {c["type"]: c for c in failed["status"]["conditions"]}["Finished"]["reason"] == "Failed"


def test_the_queue_label_names_the_local_queue() -> None:
    assert queueing.queue_name({"labels": {queueing.QUEUE_LABEL: "team"}}) == "team"
    assert queueing.queue_name({}) == ""


def test_the_integration_is_off_unless_ddp_kueue_is_true() -> None:
    assert Settings.from_env({}).kueue is False
    assert Settings.from_env({"DDP_KUEUE": "true"}).kueue is True
    with pytest.raises(ValueError, match=r"DDP_KUEUE='yes' must be true or false"):
        Settings.from_env({"DDP_KUEUE": "yes"})


def test_workloads_are_listed_and_watched_at_kueues_api_path() -> None:
    cache: informer.Cache[str] = informer.Cache(render.LABEL_JOB, lambda o: "")
    api: Any = None  # no call is made

    def collection(plural: str, ns: str | None, version: str = "v1") -> str:
        return informer.Informer(api, plural, ns, cache, print, api_version=version).collection

    assert collection("workloads", None, queueing.KUEUE_API) == (
        "/apis/kueue.x-k8s.io/v1beta2/workloads"
    )
    assert collection("workloads", "ns", queueing.KUEUE_API) == (
        "/apis/kueue.x-k8s.io/v1beta2/namespaces/ns/workloads"
    )
    assert collection("pods", "ns") == "/api/v1/namespaces/ns/pods"
    assert collection("pods", None) == "/api/v1/pods"


def test_a_suspended_job_deactivates_its_workload_and_a_resumed_one_activates_it() -> None:
    assert queueing.activation(job(), ADMITTED) is None
    assert queueing.activation(job(suspend=True), ADMITTED) == {"spec": {"active": False}}
    inactive = {**ADMITTED, "spec": {**ADMITTED["spec"], "active": False}}
    assert queueing.activation(job(suspend=True), inactive) is None
    assert queueing.activation(job(), inactive) == {"spec": {"active": True}}
    # Deactivated: released like any eviction once the pods are gone, and not requeued.
    deactivated = workload(
        cond("QuotaReserved"), cond("Admitted"), cond("Evicted", reason="Deactivated"),
        admission=ADMISSION,
    )  # fmt: skip
    body = queueing.release(deactivated, STAMP)
    assert body is not None
    requeued = {c["type"]: c for c in body["status"]["conditions"]}["Requeued"]
    assert (requeued["status"], requeued["reason"]) == ("False", "Deactivated")


def test_scaling_an_admitted_job_up_is_capped_at_the_admitted_count() -> None:
    adm = queueing.admission(ADMITTED, "team")  # 2 admitted
    status = {"phase": "Running", "queue": "team", "clusterQueue": "cq", "admissions": 1}
    pods = [running(0), running(1)]
    up = plan(job(nodes=4, minNodes=1, maxNodes=4), status, pods, NOW, RULES, admission=adm)
    assert "j-node-2" not in up.created_pods() and up.delete == []
    assert up.status["ready"] == "2/2"
    down = plan(job(nodes=1, minNodes=1, maxNodes=4), status, pods, NOW, RULES, admission=adm)
    assert down.delete == ["j-node-1"]
