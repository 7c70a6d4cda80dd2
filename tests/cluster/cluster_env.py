"""The cluster suite's providers: one suite, run against any cluster given a kubeconfig and a
way to load images.

``DDP_CLUSTER`` picks the provider:

* ``local`` (the default; `make test`): the embedded control plane and one real node of this
  machine (:mod:`ddp_devcluster.node`: kubelet, containerd, runc, CNI, CoreDNS, kube-proxy,
  local-path-provisioner), the images built by `make images` (buildah, from stand-in bases
  made from Debian packages) and imported into its containerd.
* ``kind`` (`make e2e-kind`, on hosts with Docker): ``docker build`` of both images, a kind
  cluster from kind/cluster.yaml, ``kind load``.

Either way the chart is installed with the built operator image, and a test gets a fresh
namespace that enforces the ``restricted`` Pod Security Standard.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from ddp_devcluster.polling import until
from ddp_devcluster.pytest_plugin import unavailable
from ddp_devcluster.stack import LocalStack, install_chart

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "manifests" / "examples"
LOGS = REPO / "out" / "cluster-logs"
PROVIDER = os.environ.get("DDP_CLUSTER", "local")
T = TypeVar("T")


def sh(*argv: str, input: str | None = None, timeout: float = 900, check: bool = True) -> str:
    proc = subprocess.run(
        argv, input=input, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        out = proc.stdout[-4000:] + proc.stderr[-4000:]
        raise AssertionError(f"{' '.join(argv)} failed:\n{out}")
    return proc.stdout


def kubectl_binary() -> str:
    from ddp_devcluster.plane import kubectl_path

    return kubectl_path()


@dataclass
class Cluster:
    """A cluster with the chart installed: kubectl, waits, and failure reports."""

    provider: str
    kubeconfig: Path
    operator_image: str
    trainer_image: str
    extra_logs: Callable[[Path], None] = field(default=lambda where: None)

    def k(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return sh(
            kubectl_binary(), f"--kubeconfig={self.kubeconfig}", *args, input=input, check=check
        )

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
            "objects.txt": ["get", "ddpj,pods,svc,pvc,pv,events", "-A", "-o", "wide"],
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
        self.extra_logs(where)


def _local(tmp: Path) -> Iterator[Cluster]:
    """The embedded plane and one real node of this machine, the chart installed."""
    from ddp_devcluster.node import requirements

    why = requirements()
    if why:
        unavailable(f"the local cluster's real node cannot start here: {why}")
    stack = LocalStack(chart=True, log=lambda m: print(f"\n[local] {m}", flush=True))
    try:
        stack.start()
        assert stack.plane is not None and stack.node is not None
        node = stack.node
        kubeconfig = tmp / "kubeconfig"
        shutil.copyfile(stack.plane.kubeconfig, kubeconfig)

        def node_logs(where: Path) -> None:
            for name, proc in node.procs.items():
                shutil.copyfile(proc.log, where / f"node-{name}.log")

        yield Cluster("local", kubeconfig, stack.refs["operator"], stack.refs["trainer"], node_logs)
    finally:
        stack.stop()


def _kind(tmp: Path) -> Iterator[Cluster]:
    """A kind cluster (Docker): both images built with docker and loaded with `kind load`."""
    if shutil.which("kind") is None or shutil.which("docker") is None:
        unavailable("the kind provider needs kind and docker on PATH")
    probe = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        unavailable(f"docker's daemon does not answer: {probe.stderr.strip()[:200]}")
    name = os.environ.get("KIND_CLUSTER", f"ddp-e2e-{uuid.uuid4().hex[:6]}")
    operator_image, trainer_image = "ddp-operator:e2e", "ddp-trainer:e2e"
    kubeconfig = tmp / "kubeconfig"
    sh("docker", "build", "-t", operator_image, str(REPO))
    sh("docker", "build", "-f", str(REPO / "trainer_image" / "Dockerfile"),
       "--build-arg", "VARIANT=cpu", "-t", trainer_image, str(REPO))  # fmt: skip
    sh("kind", "create", "cluster", "--name", name, "--config", str(REPO / "kind" / "cluster.yaml"),
       "--kubeconfig", str(kubeconfig), "--wait", "180s")  # fmt: skip
    try:
        for image in (operator_image, trainer_image):
            sh("kind", "load", "docker-image", image, "--name", name)
        cluster = Cluster(
            "kind",
            kubeconfig,
            operator_image,
            trainer_image,
            extra_logs=lambda where: (
                sh("kind", "export", "logs", str(where / "kind"), "--name", name, check=False)
                and None
            ),
        )
        install_chart(kubeconfig, operator_image, trainer_image, "Never")
        yield cluster
    finally:
        if os.environ.get("KEEP_KIND_CLUSTER") != "1":
            sh("kind", "delete", "cluster", "--name", name, check=False)


PROVIDERS = {"local": _local, "kind": _kind}
