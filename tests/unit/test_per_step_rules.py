"""PerStep fault tolerance (``spec.faultTolerance.mode: PerStep``): what the operator renders
(a lighthouse pod and Service, no store; the node pods' torchft environment) and what the pure
planner decides (a lost, deleted or failed group is replaced alone, scaling touches no other
group, a lost lighthouse is recreated, a job whose training finished never fails)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import planner_pods
import pytest
from ddpjobs import ddpjob, env_of
from pydantic import ValidationError

from ddp_api import contract
from ddp_api.ddpjob import DDPJob, DDPJobSpec, Reason
from ddp_operator import render
from ddp_operator.planner import completion, draft, views
from ddp_operator.planner.plan import PlanSettings, plan

NOW = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
EARLIER = "2026-01-01T11:00:00Z"
CFG = render.OperatorConfig(default_image="trainer:test")
RULES = PlanSettings(CFG)
PER_STEP = {"mode": "PerStep"}


def job(ft: dict[str, Any] | None = None, **spec: Any) -> DDPJob:
    body: dict[str, Any] = {"nodes": 3, **spec}
    if ft is not None:
        body["faultTolerance"] = ft
    return ddpjob(body)


# -- API ------------------------------------------------------------------------------------------
def test_restart_is_the_default_and_per_step_takes_its_knobs_defaults() -> None:
    assert not job().spec.per_step and not job({}).spec.per_step
    ft = job(PER_STEP).spec.fault_tolerance
    assert ft is not None and ft.per_step
    assert (ft.groups_min, ft.group_timeout_s) == (1, 5)
    assert "faultTolerance" in DDPJobSpec.model_json_schema(by_alias=True)["properties"]


@pytest.mark.parametrize(
    ("ft", "spec", "why"),
    [
        ({"minGroups": 2}, {}, "apply to mode PerStep only: set spec.faultTolerance.mode"),
        ({"groupTimeoutSeconds": 9}, {}, "apply to mode PerStep only"),
        ({**PER_STEP, "minGroups": 4}, {}, "minGroups (4) must not exceed spec.nodes (3)"),
        (
            {**PER_STEP, "minGroups": 3},
            {"minNodes": 2, "maxNodes": 4},
            "minGroups (3) must not exceed spec.minNodes (2)",
        ),
        ({**PER_STEP, "groupTimeoutSeconds": 601}, {}, "less than or equal to 600"),
        ({**PER_STEP, "minGroups": 0}, {}, "greater than or equal to 1"),
        ({"mode": "Sometimes"}, {}, "'Restart' or 'PerStep'"),
    ],
)
def test_bad_fault_tolerance_is_refused_with_the_rule(
    ft: dict[str, Any], spec: dict[str, Any], why: str
) -> None:
    with pytest.raises(ValidationError, match=why.replace("(", r"\(").replace(")", r"\)")):
        job(ft, **spec)


def test_min_groups_up_to_min_nodes_and_nproc_per_node_are_accepted() -> None:
    job({**PER_STEP, "minGroups": 2, "groupTimeoutSeconds": 30}, minNodes=2, maxNodes=4)
    job({**PER_STEP, "minGroups": 3}, nprocPerNode=2)


# -- render ---------------------------------------------------------------------------------------
def test_a_per_step_job_gets_a_lighthouse_service_instead_of_the_store() -> None:
    services = render.render_services(job(PER_STEP))
    assert [s["metadata"]["name"] for s in services] == ["j-lighthouse", "j"]
    beacon = services[0]
    assert beacon["spec"]["type"] == "ClusterIP"  # keeps resolving while the pod is replaced
    assert beacon["spec"]["selector"] == {
        render.LABEL_JOB: "j",
        render.LABEL_ROLE: render.ROLE_LIGHTHOUSE,
    }
    assert beacon["spec"]["ports"] == [
        {"name": "lighthouse", "port": contract.LIGHTHOUSE_PORT, "targetPort": 29510}
    ]
    assert beacon["metadata"]["ownerReferences"][0]["uid"] == "u-1"


def test_the_lighthouse_pod_is_restricted_credential_free_and_runs_the_quorum_server() -> None:
    pod = render.render_lighthouse(
        job({**PER_STEP, "minGroups": 2, "groupTimeoutSeconds": 7}, image="img:1"), CFG
    )
    store = render.render_store(job(), CFG)
    assert pod["metadata"]["name"] == contract.lighthouse_name("j") == "j-lighthouse"
    assert pod["metadata"]["labels"][render.LABEL_ROLE] == render.ROLE_LIGHTHOUSE
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    spec, c = pod["spec"], pod["spec"]["containers"][0]
    for key in ("restartPolicy", "automountServiceAccountToken", "securityContext"):
        assert spec[key] == store["spec"][key]
    assert spec["automountServiceAccountToken"] is False and "serviceAccountName" not in spec
    assert c["securityContext"] == store["spec"]["containers"][0]["securityContext"]
    assert c["image"] == "img:1"  # the job's trainer image: torchft ships its lighthouse
    assert c["command"] == [
        "torchft_lighthouse",
        "--min_replicas", "2",
        "--join_timeout_ms", str(render.LIGHTHOUSE_JOIN_TIMEOUT_MS),
        "--quorum_tick_ms", "100",
        "--heartbeat_timeout_ms", "7000",
        "--bind", "[::]:29510",
    ]  # fmt: skip
    assert c["env"] == [{"name": "RUST_LOG", "value": "warn"}]  # not ~7 lines a step
    # A server that keeps failing is said with its log's tail (diagnosis: ServerFailing).
    policy = "terminationMessagePolicy"
    assert c[policy] == store["spec"]["containers"][0][policy] == "FallbackToLogsOnError"
    assert c["ports"] == [{"name": "lighthouse", "containerPort": 29510}]
    assert c["readinessProbe"]["tcpSocket"] == {"port": 29510}
    assert "topologySpreadConstraints" not in spec  # not spread, like the store


def test_a_per_step_node_pod_is_a_replica_group_with_a_pod_local_rendezvous() -> None:
    spec: dict[str, Any] = {"checkpoint": {"volume": {"emptyDir": {}}}, "nprocPerNode": 2}
    restart = env_of(render.render_worker(job(**spec), 2, 0, CFG))
    per_step = env_of(render.render_worker(job({**PER_STEP, "minGroups": 2}, **spec), 2, 0, CFG))
    assert per_step["DDPJOB_FAULT_TOLERANCE"] == "PerStep"
    assert per_step["TORCHFT_LIGHTHOUSE"] == "http://j-lighthouse.ns.svc:29510"
    assert per_step["REPLICA_GROUP_ID"] == "2" == per_step["DDPJOB_NODE_INDEX"]
    assert per_step["NUM_REPLICA_GROUPS"] == "3"
    assert per_step["DDPJOB_MIN_GROUPS"] == "2" and per_step["DDPJOB_GROUP_TIMEOUT_S"] == "5"
    assert per_step["PET_NNODES"] == "1" and per_step["PET_STANDALONE"] == "1"
    assert per_step["PET_NPROC_PER_NODE"] == "2"
    rdzv = {"PET_RDZV_BACKEND", "PET_RDZV_ENDPOINT", "PET_RDZV_CONF"}
    assert not rdzv & per_step.keys() and rdzv <= restart.keys()
    assert per_step["PET_RDZV_ID"] == restart["PET_RDZV_ID"]  # the run's identity: the job's uid
    # Everything else is what a Restart pod has, but for torchrun's wait for its workers to
    # stop, which is the grace period's: a quorum try longer in PerStep mode.
    ft = {
        contract.ENV_FAULT_TOLERANCE, contract.ENV_LIGHTHOUSE, contract.ENV_REPLICA_GROUP,
        contract.ENV_GROUPS, contract.ENV_MIN_GROUPS, contract.ENV_GROUP_TIMEOUT,
        "PET_NNODES", "PET_STANDALONE", "PET_SHUTDOWN_TIMEOUT",
    }  # fmt: skip
    assert {k: v for k, v in per_step.items() if k not in ft} == {
        k: v for k, v in restart.items() if k not in rdzv | ft
    }
    assert not ft - {"PET_NNODES", "PET_SHUTDOWN_TIMEOUT"} & restart.keys()  # Restart: as before
    assert (
        int(str(per_step["PET_SHUTDOWN_TIMEOUT"])) == int(str(restart["PET_SHUTDOWN_TIMEOUT"])) + 15
    )


def test_a_node_pods_grace_period_is_the_jobs_or_the_operators_and_per_step_adds_a_try() -> None:
    def grace(ft: dict[str, Any] | None) -> int:
        spec = render.render_worker(job(ft), 0, 0, CFG)["spec"]
        return int(spec["terminationGracePeriodSeconds"])

    assert grace(None) == CFG.termination_grace_s == 60
    # The default group timeout, 5 s: a quorum try waits 15 s.
    assert grace(PER_STEP) == 60 + 15 == 60 + contract.quorum_timeout_s(5)
    # A try outlasting the grace period alone (90 s): the writer, waiting in it when SIGTERM
    # came, would be killed before it saved.
    assert grace({**PER_STEP, "groupTimeoutSeconds": 30}) == 60 + 90
    assert grace({**PER_STEP, "groupTimeoutSeconds": 1}) == 60 + 10
    # The job's own grace period (a large model's checkpoint takes long to write).
    own = {"template": {"terminationGracePeriodSeconds": 300}}
    assert (
        render.render_worker(job(**own), 0, 0, CFG)["spec"]["terminationGracePeriodSeconds"] == 300
    )
    per_step = render.render_worker(job(PER_STEP, **own), 0, 0, CFG)["spec"]
    assert per_step["terminationGracePeriodSeconds"] == 300 + 15
    assert render.render_store(job(**own), CFG)["spec"]["terminationGracePeriodSeconds"] == 5


def test_restart_mode_renders_what_it_did_before() -> None:
    for ft in (None, {"mode": "Restart"}):
        assert render.render_services(job(ft)) == render.render_services(job())
        assert render.render_worker(job(ft), 1, 0, CFG) == render.render_worker(job(), 1, 0, CFG)


# -- planner --------------------------------------------------------------------------------------
def pod(index: int, phase: str = "Running", uid: str = "", role: str = render.ROLE_WORKER,
        **changes: Any) -> views.PodView:  # fmt: skip
    return planner_pods.pod(index, phase, uid, role, **{"created": EARLIER, **changes})


LIGHTHOUSE = pod(-1, role=render.ROLE_LIGHTHOUSE)
RUNNING = {
    "phase": "Running",
    "reason": "AllNodesRunning",
    "startTime": EARLIER,
    "observedGeneration": 1,
}
GROUPS = [LIGHTHOUSE, pod(0), pod(1), pod(2)]


def created(p: draft.Plan) -> list[str]:
    return p.created_pods()


def with_(pods: list[views.PodView], x: views.PodView) -> list[views.PodView]:
    return [y for y in pods if y.name != x.name] + [x]


def test_a_new_per_step_job_creates_the_lighthouse_and_its_groups_not_the_store() -> None:
    p = plan(job(PER_STEP), {}, [], NOW, RULES)
    assert created(p) == ["j-lighthouse", "j-node-0", "j-node-1", "j-node-2"]
    services = [o["metadata"]["name"] for o in p.create if o["kind"] == "Service"]
    assert services == ["j-lighthouse", "j"]
    unchanged = plan(job(PER_STEP), RUNNING, GROUPS, NOW, RULES)
    assert created(unchanged) == [] and unchanged.delete == []
    assert unchanged.status["phase"] == "Running"


def test_a_deleted_group_is_replaced_alone_as_a_disruption() -> None:
    gone = dataclasses.replace(pod(1), deleting=True)
    p = plan(job(PER_STEP, backoffLimit=0), RUNNING, with_(GROUPS, gone), NOW, RULES)
    assert p.delete == [] and p.force == []  # nobody else is touched
    assert p.status["disruptions"] == 1 and p.status["restarts"] == 0
    assert p.status["phase"] == "Running"  # the others train on
    assert p.status["reason"] == Reason.GROUPS_CHANGING
    assert [i["kind"] for i in p.status["incidents"]] == ["Disruption"]
    ((_, _, text),) = [e for e in p.events if e[1] == "Disruption"]
    assert "replacing it alone" in text
    # Once it is gone, only it is created again.
    after = {**RUNNING, **p.status}
    q = plan(job(PER_STEP), after, [LIGHTHOUSE, pod(0), pod(2)], NOW, RULES)
    assert created(q) == ["j-node-1"] and q.delete == [] and "disruptions" not in q.status
    assert q.status["phase"] == "Running"


def test_a_group_gone_before_its_end_was_seen_is_replaced_alone_as_a_disruption() -> None:
    # Deleted during an operator failover (seen on kind): the next leader sees it gone.
    after = {**RUNNING, **plan(job(PER_STEP), RUNNING, GROUPS, NOW, RULES).status}
    p = plan(job(PER_STEP, backoffLimit=0), after, [LIGHTHOUSE, pod(0), pod(2)], NOW, RULES)
    assert created(p) == ["j-node-1"] and p.delete == [] and p.force == []
    assert p.status["disruptions"] == 1 and p.status["restarts"] == 0
    assert p.status["phase"] == "Running"
    ((_, _, text),) = [e for e in p.events if e[1] == "Disruption"]
    assert "was deleted before the operator saw it go" in text and "replacing it alone" in text
    # Seen on kind: the group's pod, SIGTERMed by its deletion, had ended (Failed) before the
    # new leader looked; still there, being deleted. The same disruption, counted once.
    ended = dataclasses.replace(pod(1, "Failed", exit_code=1), deleting=True)
    ended = dataclasses.replace(ended, uid=after["seenRunning"]["j-node-1"])
    q = plan(job(PER_STEP, backoffLimit=0), after, with_(GROUPS, ended), NOW, RULES)
    assert q.status["disruptions"] == 1 and q.status["restarts"] == 0
    assert [e[1] for e in q.events] == ["Disruption"] and q.delete == []
    again = plan(job(PER_STEP), {**after, **q.status}, with_(GROUPS, ended), NOW, RULES)
    assert "disruptions" not in again.status and again.status["restarts"] == 0


def test_a_restart_job_still_counts_a_deletion_as_a_failure() -> None:
    store = pod(-1, role=render.ROLE_STORE, uid="s")
    gone = dataclasses.replace(pod(1), deleting=True)
    p = plan(job(), RUNNING, [store, pod(0), gone, pod(2)], NOW, RULES)
    assert p.status["restarts"] == 1 and "disruptions" not in p.status


def test_a_failed_group_counts_against_backoff_limit_and_is_replaced_alone() -> None:
    failed = pod(2, "Failed", uid="f", exit_code=1)
    p = plan(job(PER_STEP), RUNNING, with_(GROUPS, failed), NOW, RULES)
    assert p.status["restarts"] == 1 and "disruptions" not in p.status
    assert p.delete == ["j-node-2"]  # itself only
    assert (
        p.status["phase"] == "Running"
        and "restart 1 of backoffLimit 3" in (p.status["conditions"][-1]["message"])
    )
    # No consequence window: a second group failing a moment later is a failure of its own.
    after = {**RUNNING, **p.status}
    second = pod(0, "Failed", uid="g", exit_code=1)
    q = plan(job(PER_STEP), after, [LIGHTHOUSE, second, pod(1), failed], NOW, RULES)
    assert q.status["restarts"] == 2
    # Past backoffLimit the job fails, as in Restart mode.
    spent = plan(job(PER_STEP, backoffLimit=0), RUNNING, with_(GROUPS, failed), NOW, RULES)
    assert spent.status["phase"] == "Failed" and spent.status["reason"] == "BackoffLimitExceeded"


def test_too_few_groups_left_is_restarting() -> None:
    failed = [pod(1, "Failed", uid="f1", exit_code=1), pod(2, "Failed", uid="f2", exit_code=1)]
    p = plan(job({**PER_STEP, "minGroups": 2}), RUNNING, [LIGHTHOUSE, pod(0), *failed], NOW, RULES)
    assert p.status["phase"] == "Restarting"


def test_a_group_on_a_lost_machine_goes_alone_as_a_disruption() -> None:
    machines = {"m1": views.MachineView("m1", "Unknown", "2026-01-01T11:59:20Z")}
    lost = dataclasses.replace(pod(0), machine="m1")
    p = plan(
        job(PER_STEP, backoffLimit=0), RUNNING, with_(GROUPS, lost), NOW, RULES, machines=machines
    )
    assert p.force == ["j-node-0"] and p.delete == []
    assert p.status["disruptions"] == 1 and p.status["restarts"] == 0
    assert p.status["phase"] == "Running" and p.status["reason"] == "NodeLost"
    assert [i["kind"] for i in p.status["incidents"]] == ["NodeLost"]


def test_a_lost_lighthouse_is_recreated_and_no_group_is_touched() -> None:
    gone = dataclasses.replace(LIGHTHOUSE, deleting=True)
    p = plan(job(PER_STEP, backoffLimit=0), RUNNING, with_(GROUPS, gone), NOW, RULES)
    assert p.delete == [] and created(p) == [] and "disruptions" not in p.status
    assert p.status["restarts"] == 0 and p.status["phase"] == "Running"
    assert [i["kind"] for i in p.status["incidents"]] == ["LighthouseLost"]
    ((kind, reason, text),) = p.events
    assert (kind, reason) == ("Warning", "LighthouseLost") and "none is restarted" in text
    after = {**RUNNING, **p.status}
    q = plan(job(PER_STEP), after, [pod(0), pod(1), pod(2)], NOW, RULES)
    assert created(q) == ["j-lighthouse"] and q.delete == []
    # Even while a failed group's backoff runs: the others need it.
    backing_off = {**after, "restarts": 2, "lastFailureTime": "2026-01-01T11:59:59Z"}
    failed = pod(2, "Failed", uid="f", exit_code=1)
    r = plan(job(PER_STEP), backing_off, [pod(0), pod(1), failed], NOW, RULES)
    assert created(r) == ["j-lighthouse"]


def test_a_lighthouse_on_a_lost_machine_is_forced_off_it_without_a_disruption() -> None:
    machines = {"m1": views.MachineView("m1", "Unknown", "2026-01-01T11:59:20Z")}
    lost = dataclasses.replace(LIGHTHOUSE, machine="m1")
    p = plan(job(PER_STEP), RUNNING, with_(GROUPS, lost), NOW, RULES, machines=machines)
    assert p.force == ["j-lighthouse"] and "disruptions" not in p.status
    assert [r for _, r, _ in p.events] == ["LighthouseLost"]


def test_scaling_adds_and_removes_the_highest_groups_and_touches_no_other() -> None:
    elastic = {"minNodes": 1, "maxNodes": 4}
    moved = {"metadata": {"name": "j", "namespace": "ns", "uid": "u-1", "generation": 2}}
    up_job = job(PER_STEP, **{**elastic, "nodes": 4}).model_copy(update=moved)
    up = plan(up_job, RUNNING, GROUPS, NOW, RULES)
    assert created(up) == ["j-node-3"] and up.delete == []
    assert up.status["phase"] == "Running" and "incidents" not in up.status  # no Resize
    down_job = job(PER_STEP, **{**elastic, "nodes": 2}).model_copy(update=moved)
    down = plan(down_job, RUNNING, [*GROUPS, pod(3)], NOW, RULES)
    assert down.delete == ["j-node-2", "j-node-3"] and created(down) == []
    assert down.status["restarts"] == 0 and "incidents" not in down.status
    assert down.status["phase"] == "Running"


def test_a_job_whose_training_finished_never_fails() -> None:
    done = {**RUNNING, "progress": {"step": 100, "totalSteps": 100}}
    failed = pod(1, "Failed", uid="f", exit_code=1)
    p = plan(job(PER_STEP, backoffLimit=0), done, with_(GROUPS, failed), NOW, RULES)
    assert p.status["phase"] == "Running" and p.status["restarts"] == 0
    assert [r for _, r, _ in p.events] == ["LostAfterTraining"] and p.delete == ["j-node-1"]
    # The first group to exit 0 completes the job, as in Restart mode.
    finished = pod(0, "Succeeded", exit_code=0, finished="2026-01-01T11:59:00Z")
    q = plan(job(PER_STEP), done, [LIGHTHOUSE, finished, pod(2)], NOW, RULES)
    assert q.status["phase"] == "Running" and q.status["reason"] == "NodesCompleting"
    late = NOW + dt.timedelta(seconds=completion.COMPLETION_GRACE_S)
    r = plan(job(PER_STEP), done, [LIGHTHOUSE, finished, pod(2)], late, RULES)
    assert r.status["phase"] == "Succeeded" and sorted(r.delete) == ["j-lighthouse", "j-node-2"]


def test_a_group_lost_after_the_last_step_is_replaced_while_too_few_are_left_to_quorum() -> None:
    # The writer saves and marks the run complete after one more quorum, which needs minGroups
    # groups: with fewer left, the lost ones are replaced (they heal at the last step).
    done = {**RUNNING, "progress": {"step": 100, "totalSteps": 100}}
    left = [LIGHTHOUSE, pod(0), pod(2)]
    two = job({**PER_STEP, "minGroups": 2})
    assert created(plan(two, done, left, NOW, RULES)) == []  # two can quorum: none waits
    three = job({**PER_STEP, "minGroups": 3})
    assert created(plan(three, done, left, NOW, RULES)) == ["j-node-1"]
    # Restart mode and minGroups 1: a node left exits 0 and completes the job alone.
    assert created(plan(job(PER_STEP), done, left, NOW, RULES)) == []
    store = pod(-1, role=render.ROLE_STORE, uid="s")
    assert created(plan(job(), done, [store, pod(0), pod(2)], NOW, RULES)) == []


def test_the_backoff_holds_only_the_failed_group_which_keeps_its_failed_pod_until_it_is_over() -> (
    None
):
    # A second failure: 10 s of backoff. The failed group's pod stays (its index held, its logs
    # readable); the group deleted meanwhile (a disruption) and the one a scale-up adds are
    # created at once: the backoff is no reason to keep them from training.
    elastic = {"minNodes": 1, "maxNodes": 4, "nodes": 4}
    moved = {"metadata": {"name": "j", "namespace": "ns", "uid": "u-1", "generation": 2}}
    up = job(PER_STEP, **elastic).model_copy(update=moved)
    after_one = {**RUNNING, "restarts": 1, "lastFailureTime": EARLIER}
    failed = pod(2, "Failed", uid="f", exit_code=1)
    gone = [LIGHTHOUSE, pod(0), failed]  # node-1 deleted and gone, node-3 added
    p = plan(up, after_one, gone, NOW, RULES)
    said = p.status["conditions"][-1]["message"]
    assert p.status["restarts"] == 2 and "recreating in 10s" in said
    assert p.delete == [] and created(p) == ["j-node-1", "j-node-3"]
    assert p.requeue_after == 10.0
    # Backoff over: the failed pod goes, and then its group is created again.
    counted = {**after_one, **p.status}
    late = NOW + dt.timedelta(seconds=10)
    q = plan(up, counted, [*gone, pod(1), pod(3)], late, RULES)
    assert q.delete == ["j-node-2"] and created(q) == []
    r = plan(up, counted, [LIGHTHOUSE, pod(0), pod(1), pod(3)], late, RULES)
    assert created(r) == ["j-node-2"]
    # Restart mode: the backoff holds every node pod, as before.
    store = pod(-1, role=render.ROLE_STORE, uid="s")
    restart = job(**elastic).model_copy(update=moved)
    s = plan(restart, after_one, [store, pod(0), failed], NOW, RULES)
    assert created(s) == [] and s.delete == ["j-node-2"]


def test_a_job_of_many_groups_resumed_at_once_counts_none_of_its_old_pods_going() -> None:
    # Suspended, a job deletes all its pods: each is recorded as handled. Resumed before they
    # are gone, none of them counts as a disruption: the handled pods still there are all kept
    # (the list was cut to its newest 64, and the others then counted).
    many = 80
    olds = [pod(i) for i in range(many)]
    batch = {"trainer": {"globalBatchSize": 128}}
    held = job(PER_STEP, nodes=many, suspend=True, **batch)
    p = plan(held, RUNNING, [LIGHTHOUSE, *olds], NOW, RULES)
    assert len(p.delete) == many + 1 and p.status["phase"] == "Suspended"
    going = [dataclasses.replace(x, deleting=True) for x in [LIGHTHOUSE, *olds]]
    q = plan(job(PER_STEP, nodes=many, **batch), {**RUNNING, **p.status}, going, NOW, RULES)
    assert "disruptions" not in q.status and q.status["restarts"] == 0
    assert [r for _, r, _ in q.events if r == "Disruption"] == []
    # Restart mode counted them as failures: with backoffLimit spent, a resume failed the job.
    store = pod(-1, role=render.ROLE_STORE, uid="s")
    held = job(nodes=many, suspend=True, backoffLimit=0, **batch)
    r = plan(held, RUNNING, [store, *olds], NOW, RULES)
    going = [dataclasses.replace(x, deleting=True) for x in [store, *olds]]
    t = plan(job(nodes=many, backoffLimit=0, **batch), {**RUNNING, **r.status}, going, NOW, RULES)
    assert t.status["restarts"] == 0 and t.status["phase"] != "Failed"
