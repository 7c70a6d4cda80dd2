"""The shipped images, chart and examples on a real cluster (see cluster_env.py for providers).

`make test` runs it on this machine's real node (``DDP_CLUSTER=local``: containerd and runc run
the images that `make images` built); `make e2e-kind` on a kind cluster. The chart is installed
with the built operator image; then, each in a namespace that enforces the restricted Pod
Security Standard: the operator Ready through its probes, with JSON logs; `digits` to
Succeeded with its checkpoints on a provisioned volume and rank 0's training in its logs; the
elastic `charlm` scaled from 2 to 3 nodes and then a worker pod deleted (the job recovers and
succeeds); the rendezvous store pod deleted mid-run; the own-script example. On a failure the
cluster's state, events and logs go to out/cluster-logs/.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from cluster_env import Cluster

# The first test also starts the cluster, which imports the images on a cold store (minutes).
pytestmark = pytest.mark.timeout(1500)


def holding(*steps: int) -> Callable[[dict[str, Any]], None]:
    """Pause the job after these steps (spec.trainer.holdAtSteps): the tests resize and delete
    pods at known steps, however fast the cluster trains."""

    def edit(job: dict[str, Any]) -> None:
        job["spec"]["trainer"]["holdAtSteps"] = list(steps)

    return edit


def held(cluster: Cluster, ns: str, job: str, step: int) -> Callable[[], dict[str, Any] | None]:
    def probe() -> dict[str, Any] | None:
        s = cluster.status(ns, job)
        if s.get("phase") in ("Succeeded", "Failed"):
            raise AssertionError(f"{job} ended before the hold after step {step}: {s}")
        return s if (s.get("progress") or {}).get("heldAtStep") == step else None

    return probe


def test_the_operator_is_ready_through_its_probes_and_logs_json(cluster: Cluster) -> None:
    pods = json.loads(
        cluster.k("get", "pods", "-n", "ddp-system", "-l", "app.kubernetes.io/name=ddp-operator",
                  "-o", "json")
    )["items"]  # fmt: skip
    assert len(pods) == 1, pods
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


def test_digits_succeeds_and_leaves_its_checkpoints_on_the_volume(
    cluster: Cluster, ns: str
) -> None:
    cluster.apply_example(ns, "checkpoint-pvc.yaml", "digits.yaml")

    def rank0_training() -> str | None:
        # Rendezvous hands out ranks in order of arrival: rank 0 may be on either pod.
        for pod in ("digits-node-0", "digits-node-1"):
            logs = cluster.k("logs", "-n", ns, pod, check=False)
            if any(line.startswith("[rank0]:") and " loss " in line for line in logs.splitlines()):
                return pod
        return None

    rank0 = cluster.until("rank 0 training in its pod's logs", rank0_training)
    print(f"rank 0 trained on {rank0}")
    status = cluster.phase(ns, "digits", "Succeeded")
    assert status["progress"]["lastCheckpoint"]
    # A pod that mounts the same claim lists what rank 0 wrote there.
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "ls-checkpoints"},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {  # what the restricted Pod Security Standard asks
                "runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "ls",
                    "image": cluster.trainer_image,
                    "imagePullPolicy": "Never",
                    "securityContext": {
                        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                    },
                    "command": ["python", "-c",
                                "import json, os; print(json.dumps(sorted(os.listdir('/c'))))"],
                    "volumeMounts": [{"name": "c", "mountPath": "/c"}],
                }
            ],
            "volumes": [
                {"name": "c", "persistentVolumeClaim": {"claimName": "digits-checkpoints"}}
            ],
        },
    }  # fmt: skip
    cluster.k("apply", "-n", ns, "-f", "-", input=json.dumps(pod))
    cluster.k("wait", "-n", ns, "pod/ls-checkpoints", "--for=jsonpath={.status.phase}=Succeeded",
           "--timeout=180s")  # fmt: skip
    files = json.loads(cluster.k("logs", "-n", ns, "pod/ls-checkpoints"))
    assert "manifest.json" in files and "metrics.jsonl" in files
    assert [f for f in files if f.startswith("step-") and f.endswith(".pt")], files


def test_charlm_scales_from_2_to_3_nodes_and_recovers_from_a_deleted_pod(
    cluster: Cluster, ns: str
) -> None:
    # Paused after steps 11 and 31: the test resizes and deletes a pod at known steps.
    cluster.apply_example(ns, "checkpoint-pvc.yaml", "charlm-elastic.yaml", edit=holding(11, 31))

    status = cluster.until("charlm held after step 11", held(cluster, ns, "charlm", 11))
    assert status["progress"]["worldSize"] == 2
    cluster.k("scale", "-n", ns, "ddpjob/charlm", "--replicas", "3")
    status = cluster.until(
        "charlm held after step 31 at world size 3", held(cluster, ns, "charlm", 31)
    )
    assert status["progress"]["worldSize"] == 3 and status["nodes"] == 3

    cluster.k("delete", "pod", "-n", ns, "charlm-node-1", "--wait=false")
    cluster.until(
        "the deleted pod counted", lambda: cluster.status(ns, "charlm").get("restarts", 0) >= 1
    )
    # The release file on the checkpoint volume, written from a pod that mounts it (node-0
    # was not deleted). The restarted group resumes after 31, so this only keeps it from
    # pausing again should it resume from an older checkpoint.
    cluster.k(
        "exec", "-n", ns, "charlm-node-0", "--", "touch", "/checkpoints/release-step-00000031"
    )
    done = cluster.phase(ns, "charlm", "Succeeded")
    assert done["progress"]["step"] == done["progress"]["totalSteps"]
    assert done["progress"]["worldSize"] == 3


def test_own_torchrun_script_from_a_configmap_succeeds(cluster: Cluster, ns: str) -> None:
    cluster.apply_example(ns, "checkpoint-pvc.yaml", "own-script.yaml")
    cluster.phase(ns, "own-script", "Succeeded")
    # Rendezvous hands out ranks in order of arrival: the script's rank 0 may be on either pod.
    logs = [cluster.k("logs", "-n", ns, f"own-script-node-{i}") for i in (0, 1)]
    assert any("step 200/200" in text for text in logs), [text[-2000:] for text in logs]


def test_losing_the_rendezvous_store_pod_mid_run_fails_nothing(cluster: Cluster, ns: str) -> None:
    cluster.apply_example(ns, "checkpoint-pvc.yaml", "digits.yaml", edit=holding(25))
    cluster.until("digits held after step 25", held(cluster, ns, "digits", 25))
    # Every pod the operator made was admitted by the restricted namespace, and their
    # processes run as the trainer image's user.
    for pod in ("digits-node-0", "digits-node-1", "digits-rdzv"):
        ids = cluster.k("exec", "-n", ns, pod, "--", "id", "-u", "-n")
        assert ids.strip() == "trainer", (pod, ids)
    old = json.loads(cluster.k("get", "pod", "-n", ns, "digits-rdzv", "-o", "json"))
    cluster.k("delete", "pod", "-n", ns, "digits-rdzv", "--wait=false")

    def new_store_running() -> bool:
        out = cluster.k("get", "pod", "-n", ns, "digits-rdzv", "-o", "json", check=False)
        pod = json.loads(out) if out else {}
        return (
            pod.get("metadata", {}).get("uid") not in (None, old["metadata"]["uid"])
            and pod.get("status", {}).get("phase") == "Running"
        )

    cluster.until("a new store pod Running", new_store_running)
    cluster.k(
        "exec", "-n", ns, "digits-node-0", "--", "touch", "/checkpoints/release-step-00000025"
    )
    done = cluster.phase(ns, "digits", "Succeeded")
    assert done.get("restarts", 0) == 0, done  # the store's loss costs no restart
    assert done["progress"]["step"] == done["progress"]["totalSteps"]
