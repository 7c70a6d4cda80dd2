"""Machines lost mid-run on the kind cluster: the job goes on and Succeeds.

A lost machine is frozen (``podman pause`` of its node container: kubelet, containerd and the
pods stop at once and say nothing, as after a kernel hang or a network partition), so
Kubernetes marks it NotReady only when its heartbeats stop arriving, and the operator deletes
its pods once its kubelet's Lease has not been renewed for DDP_NODE_LOST_GRACE_S (12 s on
kind, whose kubelets renew every 2.5 s: docs/kind.md). It is thawed after the
job has moved on, as a repaired machine would come back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from cluster_env import Cluster
from test_cluster import machines, metrics

from ddp_devcluster.harness import holding_at
from ddp_devcluster.kind import cluster as kind
from ddp_devcluster.polling import TimedOut
from ddp_devcluster.pytest_plugin import unavailable
from ddp_trainer.hold import release as release_at

pytestmark = pytest.mark.timeout(1500)
CONTROL_PLANE = "ddp-control-plane"
EVERY = 20  # digits.yaml's checkpoint.everySteps
OPERATOR = "ddp-operator"  # the chart's release: its Lease and its pods' label


def operator_replicas(cluster: Cluster) -> tuple[dict[str, Any], dict[str, Any]]:
    """The operator's leader (the pod the Lease names) and its standby, once both are Ready."""

    def both() -> tuple[dict[str, Any], dict[str, Any]] | None:
        pods = cluster.pods(f"app.kubernetes.io/name={OPERATOR}", ns="ddp-system")
        live = {n: p for n, p in pods.items() if not p["metadata"].get("deletionTimestamp")}
        holder = lease_holder(cluster)
        if len(live) != 2 or holder not in live:
            return None
        # Both Ready (the ns fixture has every machine Ready): a replica evicted from a machine
        # that an earlier test lost is gone from `live`, and its replacement is waited for.
        if not all(kind.is_ready(p) for p in live.values()):
            return None
        return live[holder], next(p for n, p in live.items() if n != holder)

    return cluster.until("the operator's leader and standby", both, 120)


def lease_holder(cluster: Cluster) -> str:
    lease = cluster.get("lease", OPERATOR, ns="ddp-system", check=True)
    return str(lease["spec"].get("holderIdentity") or "")


def spread_required(edit: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def both(job: dict[str, Any]) -> None:
        edit(job)
        job["spec"]["spread"] = "Required"

    return both


def release(cluster: Cluster, ns: str, step: int) -> None:
    """Lets the digits job held after ``step`` go on (its release file on the volume)."""
    release_at(kind.claim_folder(cluster, "digits-checkpoints", ns=ns), step)


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
            release(cluster, ns, hold)
            if hold < 60:
                cluster.held("digits", hold + 20, 900, ns=ns)  # past the loss of the machine
            else:
                done = cluster.phase("digits", "Succeeded", 900, ns=ns)
            kind.thaw(machine, cluster.kubeconfig)  # Ready again before the next scene
            frozen.remove(machine)
    finally:
        for machine in frozen:
            kind.thaw(machine, cluster.kubeconfig)
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


def test_the_operator_leader_s_machine_and_a_worker_s_powered_off_together_beat_one_replica(
    cluster: Cluster, ns: str
) -> None:
    """The machine of the operator replica that holds the Lease and the machine of a node pod
    lose their power together (``podman stop --time 0``) while the job trains: the standby
    replica takes the Lease over, a replacement pod is created on a healthy machine and
    ``status.progress`` moves again (36.5 s after the power-off, measured alone; 88 s with one
    operator replica, the chart's before leader election). The job then Succeeds."""
    if cluster.provider != "kind":
        unavailable("one machine only: losing it loses the cluster (DDP_CLUSTER=kind)")
    leader, standby = operator_replicas(cluster)
    on_leader, on_standby = leader["spec"]["nodeName"], standby["spec"]["nodeName"]
    if on_leader in (on_standby, CONTROL_PLANE):
        unavailable(f"the chart's replicas share a machine or lead on the control plane"
                    f" ({on_leader}, {on_standby}): nothing to power off alone")  # fmt: skip
    nodes = cluster.get("nodes", ns="", check=True)["items"]
    workers = sorted(n["metadata"]["name"] for n in nodes if n["metadata"]["name"] != CONTROL_PLANE)
    worker = next(n for n in workers if n not in (on_leader, on_standby))
    # The job's pods on `worker` and the control plane (one each), the standby's machine free:
    # the lost pod's replacement has one healthy machine to go to.
    for machine in (on_leader, on_standby):
        cluster.k("cordon", machine)
    powered_off: list[str] = []
    try:
        cluster.apply_example(cluster.claims, "digits.yaml", ns=ns,
                              edit=spread_required(holding_at(20)))  # fmt: skip
        cluster.held("digits", 20, 900, ns=ns)
        cluster.k("uncordon", on_standby)
        where = machines(cluster, ns, "digits")
        lost = sorted(p for p, m in where.items() if m == worker)
        assert any("-node-" in p for p in lost), where
        uids = cluster.worker_uids("digits", ns=ns)
        print(f"powering off {on_leader} (operator leader) and {worker} ({lost})")
        t0 = time.time()
        for machine in (on_leader, worker):
            kind.power_off(machine)
            powered_off.append(machine)
        release(cluster, ns, 20)
        seen: dict[str, float] = {}
        holders: list[tuple[float, str]] = []  # (seconds after the power-off, the Lease's holder)

        def recovered() -> bool:
            now = time.time() - t0
            holder = lease_holder(cluster)
            if not holders or holders[-1][1] != holder:
                holders.append((round(now, 1), holder))
            if holder == standby["metadata"]["name"]:
                seen.setdefault("lease_taken", now)
            if any(uids.get(p) not in (None, u)
                   for p, u in cluster.worker_uids("digits", ns=ns).items()):  # fmt: skip
                seen.setdefault("replaced", now)
            progress = cluster.status("digits", ns=ns).get("progress") or {}
            if int(progress.get("step") or 0) > 20:
                seen.setdefault("progress", now)
            return {"lease_taken", "replaced", "progress"} <= seen.keys()

        try:
            cluster.until("leader taken over, pod replaced, progress moving", recovered, 300, ns=ns)
        except TimedOut as e:
            raise AssertionError(f"seen {seen}; the Lease's holders {holders}; standby"
                                 f" {standby['metadata']['name']}") from e  # fmt: skip
        print("seconds after the power-off: " + ", ".join(f"{k} {v:.1f}" for k, v in seen.items()))
        done = cluster.phase("digits", "Succeeded", 900, ns=ns)
    finally:
        for machine in powered_off:
            kind.power_on(cluster.kubeconfig, machine)
        for machine in (on_leader, on_standby):
            cluster.k("uncordon", machine, check=False)
    # Measured alone: pod 23.8 s, progress 36.5 s (issue 39 asks 45 s; docs/design.md). Under
    # the suite's two lanes on two cores the same run has taken longer: the test holds it to
    # beating the single replica's 88 s, and prints what it took.
    assert seen["replaced"] < 88 and seen["progress"] < 88, seen
    assert done.get("restarts", 0) == 0, done
