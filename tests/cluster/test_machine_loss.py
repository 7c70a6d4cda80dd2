"""Machines lost mid-run on the kind cluster: the job goes on and Succeeds; the operator's own
machine lost with a job's goes unnoticed by the job but for the time the loss itself costs.

A lost machine is frozen (``podman pause`` of its node container: kubelet, containerd and the
pods stop at once and say nothing, as after a kernel hang or a network partition), so
Kubernetes marks it NotReady only when its heartbeats stop arriving, and the operator deletes
its pods once it has been NotReady for DDP_NODE_LOST_GRACE_S (30 s). It is thawed after the
job has moved on, as a repaired machine would come back. The operator's machine is powered off
instead (``podman stop --time 0``), as in the report of issue 39, and started again after.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from cluster_env import Cluster
from test_cluster import machines, metrics

from ddp_devcluster.harness import holding_at
from ddp_devcluster.kind import cluster as kind
from ddp_devcluster.operator_process import NAMESPACE
from ddp_devcluster.polling import until
from ddp_devcluster.pytest_plugin import unavailable

pytestmark = pytest.mark.timeout(1500)
CONTROL_PLANE = "ddp-control-plane"
EVERY = 20  # digits.yaml's checkpoint.everySteps


def test_three_machines_lost_in_one_run_the_store_s_among_them_and_the_job_succeeds(
    cluster: Cluster, ns: str
) -> None:
    """Held after steps 20, 40 and 60 (checkpoint steps), one machine is frozen at each
    hold: first node-1's, then the store pod's, then node-0's. With the default backoffLimit
    (3) the job Succeeds, each loss costs a disruption and not a restart, each resume starts
    within one checkpoint interval of where training was, and an Event names each machine."""
    if cluster.provider != "kind":
        unavailable("one machine only: losing it loses the cluster (DDP_CLUSTER=kind)")
    cluster.k("cordon", CONTROL_PLANE)  # only machines that can be frozen run the job
    frozen: list[str] = []
    lost: list[str] = []
    try:
        cluster.apply_example(cluster.claims, "digits.yaml", edit=holding_at(20, 40, 60), ns=ns)
        for hold, victim_pod in ((20, "digits-node-1"), (40, "digits-rdzv"), (60, "digits-node-0")):
            cluster.held("digits", hold, 900, ns=ns)
            where = machines(cluster, ns, "digits")
            machine = where[victim_pod]
            on_it = sorted(p for p, m in where.items() if m == machine)
            print(f"step {hold}: freezing {machine} ({on_it})")
            kind.freeze(machine)
            frozen.append(machine)
            lost.append(machine)
            folder = kind.claim_folder(cluster, "digits-checkpoints", ns=ns)
            (folder / f"release-step-{hold:08d}").touch()
            if hold < 60:
                cluster.held("digits", hold + 20, 900, ns=ns)  # past the loss of the machine
            else:
                done = cluster.phase("digits", "Succeeded", 900, ns=ns)
            kind.thaw(machine)
            frozen.remove(machine)
    finally:
        for machine in frozen:
            kind.thaw(machine)
        cluster.k("uncordon", CONTROL_PLANE)

    assert done["progress"]["step"] == done["progress"]["totalSteps"]
    print(f"restarts {done.get('restarts', 0)}, disruptions {done.get('disruptions')}")
    assert done.get("restarts", 0) == 0, done
    events = cluster.events("digits", ns=ns)
    said = [e.message for e in events if e.reason in ("NodeLost", "StoreLost")]
    for machine in lost:
        assert any(f"on machine {machine}," in m for m in said), (machine, said)
    assert done.get("disruptions", 0) >= 2, done  # node-1's and node-0's machines
    rows = metrics(kind.claim_folder(cluster, "digits-checkpoints", ns=ns))
    reached, lost_steps = 0, []
    for r in rows:
        if r["event"] == "start" and r.get("resumedFrom"):
            lost_steps.append(reached - int(r["step"]))
        elif r["event"] in ("step", "hold"):
            reached = max(reached, int(r["step"]))
    print(f"steps lost at each resume: {lost_steps}")
    assert lost_steps and max(lost_steps) <= EVERY, lost_steps


OPERATOR = "app.kubernetes.io/name=ddp-operator"  # the chart's replicas
LEASE = "ddp-operator"  # the chart's Lease, in NAMESPACE
BOUND_S = 45.0  # issue 39: 88 s with one operator replica; 27-31 s with the operator alive


def operator_pods(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """The chart's operator pods that run and are Ready, not being deleted."""
    pods = cluster.pods(OPERATOR, ns=NAMESPACE)
    return {
        n: p for n, p in pods.items()
        if kind.is_ready(p) and not p["metadata"].get("deletionTimestamp")
    }  # fmt: skip


def lease_holder(cluster: Cluster) -> str:
    lease = json.loads(cluster.k("get", "lease", LEASE, "-o", "json", ns=NAMESPACE))
    return str(lease.get("spec", {}).get("holderIdentity") or "")


def operators_on_two_workers(cluster: Cluster) -> tuple[str, str]:
    """(the leader's machine, the standby's): the two replicas moved off the (cordoned) control
    plane and off each other's machine where the scheduler put them so, the leader known."""

    def placed() -> tuple[str, str] | None:
        pods = operator_pods(cluster)
        on = {n: p["spec"].get("nodeName", "") for n, p in pods.items()}
        crowded = [n for n, m in on.items() if m == CONTROL_PLANE]
        crowded += [n for n, m in sorted(on.items()) if list(on.values()).count(m) > 1][1:]
        if crowded:  # deleted gracefully: a leader among them releases the Lease first
            cluster.k("delete", "pod", crowded[0], "--wait=false", ns=NAMESPACE)
            time.sleep(5)
            return None
        leader = lease_holder(cluster)
        if len(on) != 2 or leader not in on:
            return None
        (standby,) = [n for n in on if n != leader]
        return on[leader], on[standby]

    return until("two operator replicas on two workers, one leading", placed, 300, 2)


def test_the_operator_leader_s_machine_and_a_worker_s_powered_off_together_cost_under_45_s(
    cluster: Cluster, ns: str
) -> None:
    """Issue 39. The chart's two operator replicas on two workers; the job's two node pods on
    the leader's machine and the third worker (the standby's machine cordoned while they are
    placed). Held after step 20 (a checkpoint step), the leader's machine and the third worker
    are powered off together. The standby takes the Lease over (15 s), its warm caches already
    timing both machines' silence; the lost pods are replaced and ``status.progress`` moves
    past step 20 within 45 s of the power-off (one operator replica: 88 s, its own eviction
    first)."""
    if cluster.provider != "kind":
        unavailable("one machine only: losing it loses the cluster (DDP_CLUSTER=kind)")
    workers = sorted(
        n["metadata"]["name"]
        for n in json.loads(cluster.k("get", "nodes", "-o", "json"))["items"]
        if n["metadata"]["name"] != CONTROL_PLANE
    )
    cordoned = [CONTROL_PLANE]
    cluster.k("cordon", CONTROL_PLANE)
    off: list[str] = []
    try:
        leader_machine, standby_machine = operators_on_two_workers(cluster)
        (third,) = [m for m in workers if m not in (leader_machine, standby_machine)]
        print(f"operator leader on {leader_machine}, standby on {standby_machine}")
        cluster.k("cordon", standby_machine)
        cordoned.append(standby_machine)
        hold = holding_at(20)

        def edit(job: dict[str, Any]) -> None:
            hold(job)
            job["spec"]["spread"] = "Required"  # one node pod on each machine left uncordoned

        cluster.apply_example(cluster.claims, "digits.yaml", edit=edit, ns=ns)
        cluster.held("digits", 20, 900, ns=ns)
        pods = cluster.pods("ddp.dev/job-name=digits", ns=ns)
        where = {name: p["spec"].get("nodeName", "") for name, p in pods.items()}
        victims = [leader_machine, third]
        lost = {n: p["metadata"]["uid"] for n, p in pods.items() if where[n] in victims}
        assert {"digits-node-0", "digits-node-1"} <= set(lost), where
        for machine in cordoned:  # room for the replacements: the standby's and the control plane
            cluster.k("uncordon", machine)
        cordoned.clear()
        old_leader = lease_holder(cluster)
        print(f"step 20: powering off {victims} together ({sorted(lost)}, {old_leader})")

        off.extend(victims)
        t0 = time.monotonic()
        with ThreadPoolExecutor(len(victims)) as pool:  # together
            for stopping in [pool.submit(kind.power_off, m) for m in victims]:
                stopping.result()
        folder = kind.claim_folder(cluster, "digits-checkpoints", ns=ns)
        (folder / "release-step-00000020").touch()

        marks: dict[str, float] = {}

        def moving() -> dict[str, Any] | None:
            now = time.monotonic() - t0
            pods = cluster.pods("ddp.dev/job-name=digits", ns=ns)
            if "replaced" not in marks and any(
                n in pods and pods[n]["metadata"]["uid"] != uid for n, uid in lost.items()
            ):
                marks["replaced"] = now
            if "taken" not in marks and lease_holder(cluster) not in ("", old_leader):
                marks["taken"] = now
            status = cluster.status("digits", ns=ns)
            return status if (status.get("progress") or {}).get("step", 0) > 20 else None

        status = until("status.progress past step 20", moving, 300, 0.5)
        took = time.monotonic() - t0
        print(
            f"powered off -> Lease taken over {marks.get('taken', -1):.1f}s, replacement pod "
            f"{marks.get('replaced', -1):.1f}s, status.progress moving {took:.1f}s "
            f"(step {status['progress']['step']})"
        )
        assert "replaced" in marks and took <= BOUND_S, (marks, took)
        assert lease_holder(cluster) in operator_pods(cluster)
        done = cluster.phase("digits", "Succeeded", 900, ns=ns)
        assert done["progress"]["step"] == done["progress"]["totalSteps"]
    finally:
        for machine in cordoned:
            cluster.k("uncordon", machine)
        for machine in off:
            try:
                kind.power_on(cluster.kubeconfig, machine)
            except Exception as e:  # kind under podman does not promise it (docs/kind.md)
                print(f"{machine} did not come back ({e}); the next `make up` makes the cluster "
                      "again")  # fmt: skip
