"""The shipped images, chart and examples on a real kind cluster (`make e2e-kind`).

Creates a cluster from kind/cluster.yaml, builds both images, loads them into the cluster,
installs the chart, then runs the examples: `digits` to Succeeded with its checkpoints on the
volume; the elastic `charlm` scaled from 2 to 3 nodes (rank 0 reports the new world size) and
then a pod deleted mid-run (the job recovers and succeeds); the own-script example. On a
failure the cluster's state, events and logs go to out/kind-logs/. The cluster is deleted at
the end (KEEP_KIND_CLUSTER=1 keeps it). Skipped when docker (with a running daemon) or kind is
missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from ddp_devcluster.polling import until

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "manifests" / "examples"
LOGS = REPO / "out" / "kind-logs"
OPERATOR_IMAGE, TRAINER_IMAGE = "ddp-operator:e2e", "ddp-trainer:e2e"
T = TypeVar("T")


def _missing() -> str | None:
    if shutil.which("kind") is None:
        return "kind is not on PATH (https://kind.sigs.k8s.io)"
    if shutil.which("docker") is None:
        return "docker is not on PATH"
    probe = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"docker is installed but its daemon does not answer: {probe.stderr.strip()[:200]}"
    return None


REASON = _missing()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"kind suite skipped: {REASON}")


def sh(*argv: str, input: str | None = None, timeout: float = 900, check: bool = True) -> str:
    proc = subprocess.run(
        argv, input=input, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        out = proc.stdout[-4000:] + proc.stderr[-4000:]
        raise AssertionError(f"{' '.join(argv)} failed:\n{out}")
    return proc.stdout


def helm_binary() -> str:
    found = shutil.which("helm")
    if found:
        return found
    from ddp_devcluster.plane import binary

    return str(binary("helm"))


class Kind:
    def __init__(self, name: str, kubeconfig: Path):
        self.name, self.kubeconfig = name, kubeconfig

    def k(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return sh("kubectl", f"--kubeconfig={self.kubeconfig}", *args, input=input, check=check)

    def job(self, ns: str, name: str) -> dict[str, Any]:
        out = self.k("get", "ddpjob", name, "-n", ns, "-o", "json", check=False)
        return json.loads(out) if out else {}

    def status(self, ns: str, name: str) -> dict[str, Any]:
        return dict(self.job(ns, name).get("status") or {})

    def until(self, what: str, probe: Callable[[], T | None], timeout_s: float = 600) -> T:
        return until(what, probe, timeout_s, interval_s=2)

    def phase(self, ns: str, name: str, phase: str, timeout_s: float = 600) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            s = self.status(ns, name)
            if s.get("phase") == "Failed" and phase != "Failed":
                raise AssertionError(f"{ns}/{name} Failed: {s}")
            return s if s.get("phase") == phase else None

        return self.until(f"{ns}/{name} {phase}", probe, timeout_s)

    def apply_example(
        self, ns: str, *files: str, edit: Callable[[dict[str, Any]], None] | None = None
    ) -> None:
        docs = [d for f in files for d in yaml.safe_load_all((EXAMPLES / f).read_text()) if d]
        for d in docs:
            if edit is not None and d["kind"] == "DDPJob":
                edit(d)
        self.k("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all(docs))

    def collect(self, ns: str, where: Path) -> None:
        """Everything that explains a failure: objects, events, descriptions and logs."""
        where.mkdir(parents=True, exist_ok=True)
        commands = {
            "objects.txt": ["get", "ddpj,pods,svc,pvc,events", "-A", "-o", "wide"],
            "ddpjobs.yaml": ["get", "ddpj", "-n", ns, "-o", "yaml"],
            "describe-pods.txt": ["describe", "pods", "-n", ns],
            "events.txt": ["get", "events", "-n", ns, "--sort-by=.lastTimestamp"],
            "operator.log": ["logs", "-n", "ddp-system", "deploy/ddp-operator", "--tail=2000"],
            "trainers.log": [
                "logs", "-n", ns, "-l", "ddp.dev/job-name", "--prefix", "--tail=500",
                "--all-containers", "--max-log-requests=20",
            ],
        }  # fmt: skip
        for file, args in commands.items():
            (where / file).write_text(self.k(*args, check=False))
        sh("kind", "export", "logs", str(where / "kind"), "--name", self.name, check=False)


@pytest.fixture(scope="module")
def kind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kind]:
    name = os.environ.get("KIND_CLUSTER", f"ddp-e2e-{uuid.uuid4().hex[:6]}")
    kubeconfig = tmp_path_factory.mktemp("kind") / "kubeconfig"
    sh("docker", "build", "-t", OPERATOR_IMAGE, str(REPO))
    sh("docker", "build", "-f", str(REPO / "trainer_image" / "Dockerfile"),
       "--build-arg", "VARIANT=cpu", "-t", TRAINER_IMAGE, str(REPO))  # fmt: skip
    sh("kind", "create", "cluster", "--name", name, "--config", str(REPO / "kind" / "cluster.yaml"),
       "--kubeconfig", str(kubeconfig), "--wait", "180s")  # fmt: skip
    cluster = Kind(name, kubeconfig)
    try:
        for image in (OPERATOR_IMAGE, TRAINER_IMAGE):
            sh("kind", "load", "docker-image", image, "--name", name)
        repo, tag = OPERATOR_IMAGE.split(":")
        sh(helm_binary(), "--kubeconfig", str(kubeconfig), "install", "ddp-operator",
           str(REPO / "helm" / "ddp-operator"), "--namespace", "ddp-system", "--create-namespace",
           "--set", f"image.repository={repo}", "--set", f"image.tag={tag}",
           "--set", "image.pullPolicy=Never", "--set", f"trainerImage={TRAINER_IMAGE}",
           "--set", "settings.backoffBaseSeconds=2", "--wait", "--timeout", "5m")  # fmt: skip
        yield cluster
    finally:
        if os.environ.get("KEEP_KIND_CLUSTER") != "1":
            sh("kind", "delete", "cluster", "--name", name, check=False)


@pytest.fixture
def ns(kind: Kind, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace; its state and logs are collected when the test fails."""
    name = "e2e-" + request.node.name.removeprefix("test_")[:20].replace("_", "-").strip("-")
    kind.k("create", "namespace", name)
    yield name
    if getattr(request.node, "kind_failed", False):
        kind.collect(name, LOGS / request.node.name)


def test_digits_succeeds_and_leaves_its_checkpoints_on_the_volume(kind: Kind, ns: str) -> None:
    kind.apply_example(ns, "checkpoint-pvc.yaml", "digits.yaml")
    status = kind.phase(ns, "digits", "Succeeded")
    assert status["progress"]["lastCheckpoint"]
    # A pod that mounts the same claim lists what rank 0 wrote there.
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "ls-checkpoints"},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000},
            "containers": [
                {
                    "name": "ls",
                    "image": TRAINER_IMAGE,
                    "imagePullPolicy": "Never",
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
    kind.k("apply", "-n", ns, "-f", "-", input=json.dumps(pod))
    kind.k("wait", "-n", ns, "pod/ls-checkpoints", "--for=jsonpath={.status.phase}=Succeeded",
           "--timeout=180s")  # fmt: skip
    files = json.loads(kind.k("logs", "-n", ns, "pod/ls-checkpoints"))
    assert "manifest.json" in files and "metrics.jsonl" in files
    assert [f for f in files if f.startswith("step-") and f.endswith(".pt")], files


def test_charlm_scales_from_2_to_3_nodes_and_recovers_from_a_deleted_pod(
    kind: Kind, ns: str
) -> None:
    def holding(job: dict[str, Any]) -> None:
        # Paused after steps 11 and 31 (spec.trainer.holdAtSteps): the test resizes and
        # deletes a pod at known steps, however fast the cluster trains.
        job["spec"]["trainer"]["holdAtSteps"] = [11, 31]

    kind.apply_example(ns, "checkpoint-pvc.yaml", "charlm-elastic.yaml", edit=holding)

    def held(step: int) -> Callable[[], dict[str, Any] | None]:
        def probe() -> dict[str, Any] | None:
            s = kind.status(ns, "charlm")
            if s.get("phase") in ("Succeeded", "Failed"):
                raise AssertionError(f"charlm ended before the hold after step {step}: {s}")
            return s if (s.get("progress") or {}).get("heldAtStep") == step else None

        return probe

    status = kind.until("charlm held after step 11", held(11))
    assert status["progress"]["worldSize"] == 2
    kind.k("scale", "-n", ns, "ddpjob/charlm", "--replicas", "3")
    status = kind.until("charlm held after step 31 at world size 3", held(31))
    assert status["progress"]["worldSize"] == 3 and status["nodes"] == 3

    kind.k("delete", "pod", "-n", ns, "charlm-node-1", "--wait=false")
    kind.until("the deleted pod counted", lambda: kind.status(ns, "charlm").get("restarts", 0) >= 1)
    # The release file on the checkpoint volume, written from a pod that mounts it (node-0
    # was not deleted). The restarted group resumes after 31, so this only keeps it from
    # pausing again should it resume from an older checkpoint.
    kind.k("exec", "-n", ns, "charlm-node-0", "--", "touch", "/checkpoints/release-step-00000031")
    done = kind.phase(ns, "charlm", "Succeeded")
    assert done["progress"]["step"] == done["progress"]["totalSteps"]
    assert done["progress"]["worldSize"] == 3


def test_own_torchrun_script_from_a_configmap_succeeds(kind: Kind, ns: str) -> None:
    kind.apply_example(ns, "checkpoint-pvc.yaml", "own-script.yaml")
    kind.phase(ns, "own-script", "Succeeded")
    logs = kind.k("logs", "-n", ns, "own-script-node-0")
    assert "step 200/200" in logs
