"""PerStep fault tolerance against a real API server (pods driven by kwok): the lighthouse pod
and Service in place of the store, the node pods' torchft environment, a deleted group replaced
alone, scaling without touching the other groups, and a lost lighthouse recreated with no group
touched; a group beside another moved to a machine that joins or is uncordoned."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from kwok_harness import KwokNamespace, env_of

from ddp_api import contract
from ddp_api.contract import rfc3339
from ddp_devcluster.operator_process import OperatorProcess
from ddp_devcluster.plane import ControlPlane
from ddp_operator import render

pytestmark = pytest.mark.controlplane
PER_STEP = {"mode": "PerStep"}


@pytest.fixture
def c(control_plane: ControlPlane, operator: OperatorProcess) -> KwokNamespace:
    return KwokNamespace(control_plane, operator, prefix="ps")


def lighthouse(c: KwokNamespace, job: str) -> dict[str, Any]:
    """The job's lighthouse pod, once it is Ready."""
    name = contract.lighthouse_name(job)

    def ready() -> dict[str, Any] | None:
        pod = c.pods(f"ddp.dev/job-name={job},ddp.dev/role={render.ROLE_LIGHTHOUSE}").get(name)
        conds = {
            x["type"]: x["status"]
            for x in ((pod or {}).get("status") or {}).get("conditions") or []
        }
        return pod if pod and conds.get("Ready") == "True" else None

    return c.until(f"{name} Ready", ready)


def test_a_deleted_group_and_a_lost_lighthouse_are_replaced_alone(c: KwokNamespace) -> None:
    c.submit("ps", {"nodes": 3, "faultTolerance": {**PER_STEP, "minGroups": 2}})
    c.running("ps", 3)
    job_uid = c.job("ps")["metadata"]["uid"]

    # The lighthouse pod and its Service, owned by the job; no rendezvous store.
    beacon = lighthouse(c, "ps")
    assert beacon["metadata"]["ownerReferences"][0]["uid"] == job_uid
    ctr = beacon["spec"]["containers"][0]
    assert ctr["image"] == "trainer:test" and ctr["command"][0] == "torchft_lighthouse"
    assert ctr["command"][ctr["command"].index("--min_replicas") + 1] == "2"
    assert beacon["spec"]["automountServiceAccountToken"] is False
    assert beacon["spec"]["securityContext"]["runAsNonRoot"] is True
    svc = json.loads(c.k("get", "service", "ps-lighthouse", "-o", "json"))
    assert svc["spec"]["ports"][0]["port"] == contract.LIGHTHOUSE_PORT
    assert svc["spec"]["selector"][render.LABEL_ROLE] == render.ROLE_LIGHTHOUSE
    assert "ps-rdzv" not in c.pods() and "ps-rdzv" not in c.k("get", "services", "-o", "name")

    # Each node pod is a replica group with what it needs to join.
    for name, pod in c.workers("ps").items():
        env = env_of(pod)
        index = name.rsplit("-", 1)[1]
        assert env[contract.ENV_FAULT_TOLERANCE] == "PerStep"
        assert env[contract.ENV_LIGHTHOUSE] == f"http://ps-lighthouse.{c.ns}.svc:29510"
        assert env[contract.ENV_REPLICA_GROUP] == index and env[contract.ENV_GROUPS] == "3"
        assert env[contract.ENV_MIN_GROUPS] == "2" and env[contract.ENV_GROUP_TIMEOUT] == "5"
        assert env["PET_NNODES"] == "1" and env["PET_STANDALONE"] == "1"
        assert "PET_RDZV_ENDPOINT" not in env

    # A deleted group: only it is made again; a disruption, no restart.
    before = c.worker_uids("ps")
    c.k("delete", "pod", "ps-node-1", "--wait=false")

    def replaced() -> dict[str, str] | None:
        uids = c.worker_uids("ps")
        return uids if uids.get("ps-node-1") not in (None, before["ps-node-1"]) else None

    after = c.until("a new ps-node-1", replaced)
    assert after["ps-node-0"] == before["ps-node-0"] and after["ps-node-2"] == before["ps-node-2"]
    status = c.running("ps", 3)
    assert status["restarts"] == 0 and status["disruptions"] == 1, status
    assert [i["kind"] for i in status["incidents"]] == ["Disruption"]
    assert any(r == "Disruption" and "alone" in m for _, r, m in c.events("ps"))
    assert c.worker_uids("ps") == after

    # The lighthouse lost: recreated, no node pod touched, nothing counted against the job.
    old = beacon["metadata"]["uid"]
    c.k("delete", "pod", "ps-lighthouse", "--wait=false")
    c.until(
        "a new ps-lighthouse",
        lambda: (p := lighthouse(c, "ps")) and p["metadata"]["uid"] != old,
    )

    def lighthouse_lost() -> dict[str, Any] | None:
        s = c.status("ps")
        kinds = [i["kind"] for i in s.get("incidents") or []]
        return s if kinds == ["Disruption", "LighthouseLost"] else None

    status = c.until("the LighthouseLost incident", lighthouse_lost)
    assert status["restarts"] == 0 and status["disruptions"] == 1 and status["phase"] == "Running"
    assert c.worker_uids("ps") == after
    assert any(r == "LighthouseLost" for _, r, _ in c.events("ps"))


def test_scaling_adds_and_removes_the_highest_groups_without_touching_the_others(
    c: KwokNamespace,
) -> None:
    c.submit("grow", {"nodes": 3, "minNodes": 1, "maxNodes": 4, "faultTolerance": PER_STEP})
    c.running("grow", 3)
    first = c.worker_uids("grow")
    c.k("scale", "ddpjob/grow", "--replicas", "4")
    c.running("grow", 4)
    grown = c.worker_uids("grow")
    assert {n: grown[n] for n in first} == first and "grow-node-3" in grown
    assert env_of(c.workers("grow")["grow-node-3"])[contract.ENV_GROUPS] == "4"
    c.k("scale", "ddpjob/grow", "--replicas", "2")
    c.until(
        "groups 2 and 3 removed",
        lambda: sorted(c.workers("grow")) == ["grow-node-0", "grow-node-1"],
    )
    status = c.running("grow", 2)
    assert c.worker_uids("grow") == {n: first[n] for n in ("grow-node-0", "grow-node-1")}
    assert status["restarts"] == 0 and not status.get("disruptions")
    assert not status.get("incidents")  # no Resize: nobody restarted


@pytest.mark.parametrize("back", ["joins", "is uncordoned"])
def test_a_group_beside_another_moves_to_a_machine_that_comes_back(
    c: KwokNamespace, back: str
) -> None:
    """kube-scheduler places the pods. With one machine for the job both groups share it
    (spread Preferred places them anyway); a second machine joins, or is uncordoned (as after
    ``kubectl drain``), and the newest group moves there, alone, once; the other group is not
    touched."""
    first, second = (f"rb-{c.ns}-{i}" for i in range(2))
    c.cp.add_kwok_node(first, labels={"rebalance": c.ns})
    if back == "is uncordoned":
        c.cp.add_kwok_node(second, labels={"rebalance": c.ns})
        c.cp.kubectl("cordon", second)
    try:
        only = {"nodeSelector": {"rebalance": c.ns}}
        c.submit("rb", {"nodes": 2, "faultTolerance": PER_STEP, "template": only})
        c.running("rb", 2)
        before = c.worker_uids("rb")
        placed = {n: p["spec"]["nodeName"] for n, p in c.workers("rb").items()}
        assert set(placed.values()) == {first}, placed
        # Node times are whole seconds: the machine comes back in a later second than the pods.
        newest = max(p["metadata"]["creationTimestamp"] for p in c.workers("rb").values())
        c.until("a second past the pods' creation", lambda: rfc3339(time.time()) > newest)
        if back == "joins":
            c.cp.add_kwok_node(second, labels={"rebalance": c.ns})
        else:
            c.cp.kubectl("uncordon", second)

        def apart() -> dict[str, str] | None:
            pods = c.workers("rb")
            where = {n: p["spec"].get("nodeName") for n, p in pods.items()}
            ready = c.status("rb").get("readyNodes") == 2
            return where if ready and set(where.values()) == {first, second} else None

        where = c.until("the groups on a machine each", apart)
        after = c.worker_uids("rb")
        assert where["rb-node-0"] == first and after["rb-node-0"] == before["rb-node-0"]
        assert after["rb-node-1"] != before["rb-node-1"]  # the newest (index breaks the tie)
        status = c.running("rb", 2)
        assert status["restarts"] == 0 and not status.get("disruptions")
        assert [i["kind"] for i in status.get("incidents") or []] == ["Rebalance"]
        [said] = [m for t, r, m in c.events("rb") if (t, r) == ("Normal", "Rebalancing")]
        assert said.startswith(f"rb-node-1 shares machine {first} with rb-node-0 while {second}")
    finally:
        for machine in (first, second):
            c.cp.kubectl("delete", "node", machine, "--wait=false")
