"""The shipped images, chart and examples on a real cluster (see cluster_env.py for providers).

`make test` runs it on the 4-machine kind cluster (``DDP_CLUSTER=kind``, the default: the
images that `make images` built, pulled by every machine from the registry on the host;
checkpoints on the ReadWriteMany ``ddp-shared`` class). The chart is installed with the built
operator image; then, each in a namespace that enforces the restricted Pod Security Standard:
the operator Ready through its probes, with JSON logs (`digits` to Succeeded with its
checkpoints on the volume is the demo's test, test_demo_on_kind.py); the elastic `charlm` with
``spread: Required`` scaled 2 -> 3 -> 4, a pod per machine, then down to 2, no step lost; the
rendezvous store pod deleted mid-run and recreated on a machine without workers; a node pod's
machine drained mid-run (a disruption, not a restart); the own-script example; rank 0 moved to
another machine, resuming exactly from its checkpoint.
On a failure the cluster's state, events and logs go to out/cluster-logs/.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from cluster_env import Cluster

from ddp_devcluster.harness import holding_at
from ddp_devcluster.kind import cluster as kind
from ddp_devcluster.pytest_plugin import unavailable
from ddp_trainer.hold import release as release_at
from ddp_trainer.reporting.run_log import read_run_log

# The first test also starts the cluster, which imports the images on a cold store (minutes).
pytestmark = pytest.mark.timeout(1500)


def test_the_operator_is_ready_through_its_probes_and_logs_json(cluster: Cluster) -> None:
    def replicas() -> list[dict]:  # not those of a release before, still going after an upgrade
        items = json.loads(
            cluster.k("get", "pods", "-n", "ddp-system", "-l",
                      "app.kubernetes.io/name=ddp-operator", "-o", "json")
        )["items"]  # fmt: skip
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def leading() -> list[dict] | None:
        pods = replicas()
        lease = json.loads(
            cluster.k("get", "lease", "ddp-operator", "-n", "ddp-system", "-o", "json")
        )
        held = lease["spec"].get("holderIdentity") in [p["metadata"]["name"] for p in pods]
        return pods if len(pods) == 2 and held else None

    # The chart's two replicas (spread over machines: a preference); the Lease names one of
    # them as the leader (after an upgrade of a cluster made before, once the old one let go).
    pods = cluster.until("two replicas, one of them leading", leading, 60)
    print(f"operator replicas on {sorted(p['spec']['nodeName'] for p in pods)}")
    pod = pods[0]
    container = pod["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert ready["Ready"] == "True", pod["status"]
    assert pod["status"]["containerStatuses"][0]["image"].endswith(cluster.operator_image)
    # The image's user, not root: what the container's processes really run as.
    uid = cluster.k("exec", "-n", "ddp-system", pod["metadata"]["name"], "--",
                    "python", "-c", "import os; print(os.getuid(), os.getgid())")  # fmt: skip
    assert uid.split() == ["10001", "10001"]
    lines = [
        json.loads(line)
        for line in cluster.k("logs", "-n", "ddp-system", pod["metadata"]["name"]).splitlines()
        if line.startswith("{")
    ]
    assert lines, "the operator wrote no JSON log line"
    assert all("message" in line for line in lines)


def test_charlm_scales_2_to_3_to_4_one_pod_per_machine_then_down_to_2_losing_no_step(
    cluster: Cluster, ns: str
) -> None:
    """``spread: Required``: each pod that ``kubectl scale`` adds lands on a machine that had
    none of the job's pods (where the cluster has the machines), and the world size follows;
    scaled down to 2 at the end. Each resize happens at a hold point and restarts the held
    workers (SIGTERM: rank 0 saves the held step), so every resize resumes from the step it
    stopped at: no step is trained twice."""
    spread = cluster.provider == "kind"  # four machines; the local cluster has one

    def edit(job: dict[str, Any]) -> None:
        holding_at(11, 21, 31, last=40)(job)  # the resizes, then the end
        job["spec"]["trainer"]["logEverySteps"] = 1  # a line per step: none lost or redone
        if spread:
            job["spec"]["spread"] = "Required"

    cluster.apply_example(cluster.claims, "charlm-elastic.yaml", edit=edit, ns=ns)

    def node_machines() -> list[str]:
        where = machines(cluster, ns, "charlm")
        return [m for p, m in sorted(where.items()) if p != "charlm-rdzv"]

    for hold, size, then in ((11, 2, 3), (21, 3, 4), (31, 4, 2)):
        status = cluster.held("charlm", hold, ns=ns)
        assert status["progress"]["worldSize"] == size and status["nodes"] == size, status
        on = node_machines()
        print(f"step {hold}: world size {size} on {on}")
        if spread:
            assert len(set(on)) == size, on  # one pod per machine
        cluster.k("scale", "-n", ns, "ddpjob/charlm", "--replicas", str(then))

    done = cluster.phase("charlm", "Succeeded", ns=ns)
    assert done["progress"]["step"] == done["progress"]["totalSteps"] == 40
    # (the world size of the last steps is the run log's below: status.progress may hold the
    # record of a node that resumed alone after the end, found the run complete and stopped)
    assert done.get("restarts", 0) == 0, done
    rows = read_run_log(kind.claim_folder(cluster, "charlm-checkpoints", ns=ns))
    sizes = [r["worldSize"] for r in rows if r.get("event") == "step"]
    assert [w for i, w in enumerate(sizes) if i == 0 or w != sizes[i - 1]] == [2, 3, 4, 2]
    starts = [r for r in rows if r.get("event") == "start" and r.get("resumedFrom")]
    # each resize: the held step (a node that resumed alone after the end trained nothing)
    assert [r["step"] for r in starts if r["step"] < 40] == [11, 21, 31], starts
    steps = [r["step"] for r in rows if r.get("event") == "step"]
    assert steps == list(range(1, 41)), steps  # every step once: none lost, none redone


def test_own_torchrun_script_from_a_configmap_succeeds(cluster: Cluster, ns: str) -> None:
    cluster.apply_example(cluster.claims, "own-script.yaml", ns=ns)
    cluster.phase("own-script", "Succeeded", ns=ns)
    # Rendezvous hands out ranks in order of arrival: the script's rank 0 may be on either pod.
    logs = [cluster.k("logs", "-n", ns, f"own-script-node-{i}") for i in (0, 1)]
    assert any("step 200/200" in text for text in logs), [text[-2000:] for text in logs]


def test_losing_the_rendezvous_store_pod_mid_run_fails_nothing(cluster: Cluster, ns: str) -> None:
    cluster.apply_example(cluster.claims, "digits.yaml", edit=holding_at(25, last=30), ns=ns)
    cluster.held("digits", 25, ns=ns)
    # Every pod the operator made was admitted by the restricted namespace, and their
    # processes run as the trainer image's user.
    for pod in ("digits-node-0", "digits-node-1", "digits-rdzv"):
        ids = cluster.k("exec", "-n", ns, pod, "--", "id", "-u", "-n")
        assert ids.strip() == "trainer", (pod, ids)
    old = json.loads(cluster.k("get", "pod", "-n", ns, "digits-rdzv", "-o", "json"))
    worker_uids = cluster.worker_uids("digits", ns=ns)
    # Across machines: the new store pod goes where no worker runs, so every rendezvous
    # message after this crosses the pod network between machines.
    workers = {m for p, m in machines(cluster, ns, "digits").items() if p != "digits-rdzv"}
    closed = sorted(workers) if cluster.provider == "kind" else []
    for machine in closed:
        cluster.k("cordon", machine)
    cluster.k("delete", "pod", "-n", ns, "digits-rdzv", "--wait=false")

    def new_store_running() -> bool:
        out = cluster.k("get", "pod", "-n", ns, "digits-rdzv", "-o", "json", check=False)
        pod = json.loads(out) if out else {}
        return (
            pod.get("metadata", {}).get("uid") not in (None, old["metadata"]["uid"])
            and pod.get("status", {}).get("phase") == "Running"
        )

    try:
        cluster.until("a new store pod Running", new_store_running)
    finally:
        for machine in closed:
            cluster.k("uncordon", machine)
    store_on = machines(cluster, ns, "digits")["digits-rdzv"]
    if cluster.provider == "kind":
        assert store_on not in workers, (store_on, workers)
    cluster.k(
        "exec", "-n", ns, "digits-node-0", "--", "touch", "/checkpoints/release-step-00000025"
    )
    done = cluster.phase("digits", "Succeeded", ns=ns)
    assert done.get("restarts", 0) == 0, done  # the store's loss costs no restart
    assert done["progress"]["step"] == done["progress"]["totalSteps"]
    assert cluster.worker_uids("digits", ns=ns) == worker_uids  # the same pods ran to the end
    events = cluster.events("digits", ns=ns)
    reasons = {e.reason for e in events}
    assert "StoreLost" in reasons and "PodFailed" not in reasons, reasons


def test_kubectl_drain_of_a_node_pod_s_machine_is_a_disruption_and_the_job_succeeds(
    cluster: Cluster, ns: str
) -> None:
    """`kubectl drain` of the machine under a node pod mid-run (its eviction API call, the
    pod ending gracefully): a disruption in ``status.disruptions``, never a restart against
    ``backoffLimit``; the pod is made again on another machine and the job Succeeds."""
    if cluster.provider != "kind":
        unavailable("one machine only: a drained pod would have nowhere to go (DDP_CLUSTER=kind)")
    cluster.apply_example(cluster.claims, "digits.yaml", edit=holding_at(25, last=30), ns=ns)
    cluster.held("digits", 25, ns=ns)
    target = machines(cluster, ns, "digits")["digits-node-1"]
    old = cluster.worker_uids("digits", ns=ns)["digits-node-1"]
    try:
        # Only this job's node pod is drained: the machine may also hold the operator and
        # other tests' pods, which a maintenance drain would move too, at its own pace.
        cluster.k("drain", target, "--ignore-daemonsets", "--delete-emptydir-data",
                  "--pod-selector=ddp.dev/job-name=digits,ddp.dev/role=worker",
                  "--timeout=180s")  # fmt: skip

        def replaced() -> str | None:
            now = cluster.worker_uids("digits", ns=ns).get("digits-node-1")
            where = machines(cluster, ns, "digits").get("digits-node-1")
            return where if now not in (None, old) and where else None

        moved_to = cluster.until("digits-node-1 made again on another machine", replaced)
    finally:
        cluster.k("uncordon", target)
    assert moved_to != target, (moved_to, target)
    cluster.k(
        "exec", "-n", ns, "digits-node-0", "--", "touch", "/checkpoints/release-step-00000025"
    )
    done = cluster.phase("digits", "Succeeded", ns=ns)
    assert done["progress"]["step"] == done["progress"]["totalSteps"]
    assert done.get("disruptions", 0) >= 1 and done.get("restarts", 0) == 0, done
    events = cluster.events("digits", ns=ns)
    assert any(e.reason == "Disruption" and "EvictionByEvictionAPI" in e.message for e in events), [
        (e.reason, e.message) for e in events
    ]


def machines(cluster: Cluster, ns: str, job: str) -> dict[str, str]:
    """The machine (Kubernetes node) of each pod of a job, by pod name."""
    pods = cluster.pods(f"ddp.dev/job-name={job}", ns=ns)
    return {name: p["spec"].get("nodeName", "") for name, p in pods.items()}


def lone_groups(where: dict[str, str], job: str) -> list[str]:
    """A PerStep job's node pods that are alone on a machine without its lighthouse (``where``:
    :func:`machines`): powering such a machine off loses one group and nothing else."""
    beacon = where.get(f"{job}-lighthouse")
    on = Counter(where.values())
    return [p for p in sorted(where) if "-node-" in p and where[p] != beacon and on[where[p]] == 1]


def metrics(folder: Path) -> list[dict[str, Any]]:
    """The rows of a checkpoint folder's metrics.jsonl (rank 0 appends them)."""
    text = (folder / "metrics.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def rank0_pod(cluster: Cluster, ns: str, job: str) -> str | None:
    """The pod whose worker logs as global rank 0 (rendezvous orders ranks by arrival)."""
    for pod in machines(cluster, ns, job):
        if pod.endswith("-rdzv"):
            continue
        logs = cluster.k("logs", "-n", ns, pod, check=False)
        if any(line.startswith("[rank0]:") and " loss " in line for line in logs.splitlines()):
            return pod
    return None


def test_rank_0_moves_to_another_machine_and_resumes_exactly_from_its_checkpoint(
    cluster: Cluster, ns: str
) -> None:
    """Rank 0 writes the step-20 checkpoint on machine A; its pod is lost (killed, no
    goodbye) at step 30 and A is closed to new pods; the job resumes on other machines from
    that checkpoint, through the ReadWriteMany volume, and its step 30 is the same as before:
    same step, same loss."""
    if cluster.provider != "kind":
        unavailable("one machine only: rank 0 cannot move to another (DDP_CLUSTER=kind)")

    def edit(job: dict[str, Any]) -> None:
        holding_at(30, last=32)(job)
        job["spec"]["trainer"]["logEverySteps"] = 1  # a loss line per step, to compare

    cluster.apply_example(cluster.claims, "digits.yaml", edit=edit, ns=ns)
    cluster.held("digits", 30, ns=ns)
    first = cluster.until("the pod of rank 0", lambda: rank0_pod(cluster, ns, "digits"))
    where = machines(cluster, ns, "digits")
    machine_a = where[first]
    folder = kind.claim_folder(cluster, "digits-checkpoints", ns=ns)
    before = [r for r in metrics(folder) if r["event"] == "step"]
    assert [r["step"] for r in before] == list(range(1, 31)), before
    cluster.k("cordon", machine_a)
    try:
        # Lost, not stopped: SIGKILL of every process of the pod but its first (the kernel
        # spares a namespace's init), so rank 0 cannot checkpoint step 30 on its way out, as a
        # delete would let it (kubelet sends SIGTERM first, even when forced). The pod fails
        # and is recreated on another machine.
        cluster.k("exec", "-n", ns, first, "--", "sh", "-c", "kill -KILL -1", check=False)

        def held_again() -> list[dict[str, Any]] | None:
            rows = metrics(folder)
            holds = [r for r in rows if r["event"] == "hold" and r["step"] == 30]
            return rows if len(holds) == 2 else None

        rows = cluster.until("digits held after step 30 again, resumed", held_again)
        now = machines(cluster, ns, "digits")
        second = cluster.until("the new rank 0", lambda: rank0_pod(cluster, ns, "digits"))
    finally:
        cluster.k("uncordon", machine_a)
    starts = [r for r in rows if r["event"] == "start"]
    assert (starts[-1]["step"], starts[-1]["resumedFrom"]) == (20, "step-00000020.pt"), starts
    assert now[second] != machine_a, (machine_a, now)
    replayed = [r for r in rows[rows.index(starts[-1]) :] if r["event"] == "step"]
    assert [r["step"] for r in replayed] == list(range(21, 31)), replayed
    # Steps 21-30 again, from the checkpoint A wrote: the same loss, to the last bit.
    assert [r["loss"] for r in replayed] == [r["loss"] for r in before[20:]], (before, replayed)
    print(f"rank 0: {first} on {machine_a} -> {second} on {now[second]};"
          f" steps 21-30 replayed with the same losses ({before[-1]['loss']} at 30)")  # fmt: skip
    release_at(folder, 30)
    done = cluster.phase("digits", "Succeeded", ns=ns)
    assert done["progress"]["step"] == done["progress"]["totalSteps"]
