"""The cluster suite's providers: one suite, run against any cluster given a kubeconfig and a
way to load images.

``DDP_CLUSTER`` picks the provider:

* ``kind`` (the default; `make test`): the kind cluster of `make up` (kind/cluster-4.yaml:
  one control plane and three workers, podman's provider, the node image assembled by
  :mod:`ddp_devcluster.kind.nodeimage`), reused when it is up already. The images that
  `make images` built (buildah) are pushed to the registry on the host and pulled from it by
  every machine's containerd; checkpoints go on the ``ddp-shared`` ReadWriteMany class.

(``local``, the embedded control plane and the home-made real node of this machine, was
retired with that node when the end-to-end tier moved to kind.) The chart is installed with
the built operator image, and a test gets a fresh namespace that enforces the ``restricted``
Pod Security Standard.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

from ddp_devcluster.harness import Harness

REPO = Path(__file__).resolve().parents[2]
LOGS = REPO / "out" / "cluster-logs"
PROVIDER = os.environ.get("DDP_CLUSTER", "kind")


class Cluster(Harness):
    """A cluster with the chart installed: the harness on it, and failure reports."""

    timeout_s = 600
    interval_s = 2
    kubectl_timeout_s = 900

    def __init__(
        self,
        provider: str,
        kubeconfig: Path,
        operator_image: str,
        trainer_image: str,
        extra_logs: Callable[[Path], None] = lambda where: None,
        claims: str = "checkpoint-pvc.yaml",
    ):
        super().__init__(kubeconfig)
        self.provider = provider
        self.operator_image, self.trainer_image = operator_image, trainer_image
        self.extra_logs = extra_logs
        # The examples' checkpoint claims that fit the cluster: ReadWriteMany where pods of a
        # job run on several machines, ReadWriteOnce on one machine.
        self.claims = claims

    def collect(self, ns: str, where: Path) -> None:
        """Everything that explains a failure: objects, events, descriptions and logs."""
        where.mkdir(parents=True, exist_ok=True)
        commands = {
            "objects.txt": ["get", "ddpj,pods,svc,pvc,pv,events", "-A", "-o", "wide"],
            "ddpjobs.yaml": ["get", "ddpj", "-n", ns, "-o", "yaml"],
            "describe-pods.txt": ["describe", "pods", "-n", ns],
            "events.txt": ["get", "events", "-n", ns, "--sort-by=.lastTimestamp"],
            "operator.log": [  # both replicas, each line prefixed with its pod
                "logs", "-n", "ddp-system", "-l", "app.kubernetes.io/name=ddp-operator",
                "--prefix", "--tail=2000",
            ],
            "trainers.log": [
                "logs", "-n", ns, "-l", "ddp.dev/job-name", "--prefix", "--tail=500",
                "--all-containers", "--max-log-requests=20",
            ],
        }  # fmt: skip
        for file, args in commands.items():
            (where / file).write_text(self.k(*args, check=False))
        self.extra_logs(where)
        if self.provider == "kind":
            self._volumes(ns, where / "volumes")

    def _volumes(self, ns: str, where: Path) -> None:
        """The run log and the kept node logs of every claim of ``ns`` (the namespace, and its
        claims' folders with it, go once the test ends)."""
        import shutil

        from ddp_api.contract import LOGS_DIR, RUN_LOG_FILE
        from ddp_devcluster.kind import cluster as kind

        for pvc in self.get("pvc", ns=ns).get("items", []):
            claim = pvc["metadata"]["name"]
            try:
                folder = kind.claim_folder(self, claim, ns=ns)
            except Exception as e:  # unbound, or not the shared class: nothing to copy
                print(f"claim {claim}: {e}")
                continue
            (where / claim).mkdir(parents=True, exist_ok=True)
            if (folder / RUN_LOG_FILE).exists():
                shutil.copy(folder / RUN_LOG_FILE, where / claim / RUN_LOG_FILE)
            if (folder / LOGS_DIR).is_dir():
                shutil.copytree(folder / LOGS_DIR, where / claim / LOGS_DIR, dirs_exist_ok=True)


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
    "kind": _kind,
}
