"""The cluster suite's providers: one suite, run against any cluster given a kubeconfig and a
way to load images.

``DDP_CLUSTER`` picks the provider:

* ``kind`` (the default; `make test`): the kind cluster of `make up` (kind/cluster-4.yaml:
  one control plane and three workers, podman's provider, the node image assembled by
  :mod:`ddp_devcluster.kind.nodeimage`), reused when it is up already. The images that
  `make images` built (buildah) are pushed to the registry on the host and pulled from it by
  every machine's containerd; checkpoints go on the ``ddp-shared`` ReadWriteMany class.
* ``local``: the embedded control plane and one real node of this machine
  (:mod:`ddp_devcluster.node`), the images imported into its containerd; everything on one
  machine, so checkpoints go on ReadWriteOnce claims.

Either way the chart is installed with the built operator image, and a test gets a fresh
namespace that enforces the ``restricted`` Pod Security Standard.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from ddp_devcluster.polling import until
from ddp_devcluster.pytest_plugin import unavailable
from ddp_devcluster.stack import LocalStack

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "manifests" / "examples"
LOGS = REPO / "out" / "cluster-logs"
PROVIDER = os.environ.get("DDP_CLUSTER", "kind")
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
    # The examples' checkpoint claims that fit the cluster: ReadWriteMany where pods of a job
    # run on several machines, ReadWriteOnce on one machine.
    claims: str = "checkpoint-pvc.yaml"

    def k(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return sh(
            kubectl_binary(), f"--kubeconfig={self.kubeconfig}", *args, input=input, check=check
        )

    def job(self, ns: str, name: str) -> dict[str, Any]:
        out = self.k("get", "ddpjob", name, "-n", ns, "-o", "json", check=False)
        return json.loads(out) if out else {}

    def status(self, ns: str, name: str) -> dict[str, Any]:
        return dict(self.job(ns, name).get("status") or {})

    def events(self, ns: str, name: str) -> list[dict[str, Any]]:
        """The Events about object ``name`` of ``ns`` (a job's: what the operator said)."""
        out = self.k("get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}",
                     "-o", "json")  # fmt: skip
        return list(json.loads(out)["items"])

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


def _local(kubeconfig: Path | None, tmp: Path) -> Iterator[Cluster]:
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


def _kind(kubeconfig: Path | None, tmp: Path) -> Iterator[Cluster]:
    """The 4-machine kind cluster (``kind_cluster``): both images pushed to the host registry
    and pulled onto every machine before the first test, the chart installed from them."""
    from ddp_devcluster.kind import cluster as kind

    assert kubeconfig is not None
    remote = kind.install(kubeconfig, log=lambda m: print(f"\n[kind] {m}", flush=True))
    yield Cluster(
        "kind",
        kubeconfig,
        remote["operator"],
        remote["trainer"],
        extra_logs=lambda where: kind.export_logs(where / "kind"),
        claims="checkpoint-pvc-shared.yaml",
    )
    # The release stays: the cluster is deleted after its last test when this session made it,
    # and a cluster of `make up` keeps the chart it had (the same images).


PROVIDERS: dict[str, Callable[[Path | None, Path], Iterator[Cluster]]] = {
    "local": _local,
    "kind": _kind,
}
