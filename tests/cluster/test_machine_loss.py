"""Machines lost mid-run on the kind cluster: the job goes on and Succeeds.

A lost machine is frozen (``podman pause`` of its node container: kubelet, containerd and the
pods stop at once and say nothing, as after a kernel hang or a network partition), so
Kubernetes marks it NotReady only when its heartbeats stop arriving, and the operator deletes
its pods once it has been NotReady for DDP_NODE_LOST_GRACE_S (30 s). It is thawed after the
job has moved on, as a repaired machine would come back.
"""

from __future__ import annotations

import pytest
from cluster_env import Cluster
from test_cluster import machines, metrics

from ddp_devcluster.harness import holding_at
from ddp_devcluster.kind import cluster as kind
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
