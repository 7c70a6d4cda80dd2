"""The end-to-end stack on the kind cluster (tests/e2e): the cluster of `make up` (made or
reused), both images published to it, and the operator as a process of this checkout on this
machine against the cluster's API, under the manifests' RBAC (the scenarios SIGKILL and restart
it and scrape its metrics), with real Kueue beside it when asked.

The chart's operator, when the cluster has one (`make up`, the cluster suite), is scaled to
zero meanwhile and back afterwards: one operator at a time. This machine gets a route to every
node's pods, so a process here reaches a pod by its IP as one on a node would (a Prometheus
server scraping the trainer pods).

    with KindStack(workdir=tmp, kueue=True) as s:
        s.apply_example("checkpoint-pvc-shared.yaml", "digits.yaml")
        s.phase("digits", "Succeeded", stall_s=300)
"""

from __future__ import annotations

import base64
import json
import shutil
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..harness import Harness
from ..kueue import KueueProcess, operator_rbac
from ..operator_process import NAMESPACE, SERVICE_ACCOUNT, OperatorProcess, install
from ..plane import ClusterAPI
from . import cluster as kind
from .lock import hold

CHART_OPERATOR = "deploy/ddp-operator"  # the chart's Deployment, in NAMESPACE


@dataclass
class KindAPI(ClusterAPI):
    """The kind cluster's API as processes of this machine use it."""

    admin: Path  # kind's kubeconfig (cluster-admin)
    webhook_host: str  # this machine on kind's network (kind.host_address)
    marker: str = field(default_factory=lambda: uuid.uuid4().hex)
    server: str = field(init=False)
    ca_pem: bytes = field(init=False)

    def __post_init__(self) -> None:
        config = yaml.safe_load(self.admin.read_text())
        entry = config["clusters"][0]["cluster"]
        self.server = entry["server"]
        self.ca_pem = base64.b64decode(entry["certificate-authority-data"])

    @property
    def kubeconfig(self) -> Path:
        return self.admin


@dataclass
class KindStack(Harness):
    """The stack, and the harness on it (:class:`~ddp_devcluster.harness.Harness`)."""

    workdir: Path | None = None
    operator_env: dict[str, str] = field(default_factory=dict)
    log: Callable[[str], None] = print
    kueue: bool = False  # real Kueue beside the operator, with the chart's kueue.enabled RBAC

    api: KindAPI | None = field(default=None, init=False)
    operator: OperatorProcess | None = field(default=None, init=False)
    queues: KueueProcess | None = field(default=None, init=False)
    refs: dict[str, str] = field(default_factory=dict, init=False)
    chart_replicas: int = field(default=0, init=False)  # the chart operator's, to give back
    _own_workdir: bool = field(default=False, init=False)
    _release: Callable[[], None] | None = field(default=None, init=False)

    def start(self) -> KindStack:
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="ddp-kind-stack-"))
            self._own_workdir = True
        self._release = hold(kind.NAME, "a stack of the operator on kind", self.log)
        try:
            admin = kind.up(log=self.log)
            self.refs = kind.publish(admin, log=self.log)
            self.api = KindAPI(admin, kind.host_address())
            routes = kind.route_to_pods(admin)
            self.log(f"routes to the pods: {', '.join(f'{c} via {ip}' for c, ip in routes)}")
            self._stop_chart_operator()
            if self.kueue:
                self.queues = KueueProcess(self.api, self.workdir / "kueue").start()
            install(self.api)
            env = {"DDP_DEFAULT_IMAGE": self.refs["trainer"], **self.operator_env}
            if self.kueue:
                for doc in operator_rbac(SERVICE_ACCOUNT, NAMESPACE):
                    self.api.kubectl("apply", "-f", "-", input=json.dumps(doc))
                env["DDP_KUEUE"] = "true"
            self.operator = OperatorProcess(self.api, self.workdir / "operator", env).start()
        except BaseException:
            self.stop()
            raise
        return self

    def _stop_chart_operator(self) -> None:
        assert self.api is not None
        found = self.api.kubectl(
            "-n", NAMESPACE, "get", CHART_OPERATOR, "-o", "jsonpath={.spec.replicas}",
            "--ignore-not-found",
        ).stdout.strip()  # fmt: skip
        if found and int(found) > 0:
            self.chart_replicas = int(found)
            self.log(f"the chart's operator scaled to 0 (from {found}) while this stack runs")
            self.api.kubectl("-n", NAMESPACE, "scale", CHART_OPERATOR, "--replicas=0")
            self.api.kubectl("-n", NAMESPACE, "wait", "--for=delete", "pod",
                             "-l", "app.kubernetes.io/name=ddp-operator", "--timeout=120s",
                             check=False)  # fmt: skip

    def stop(self) -> None:
        for part in (self.operator, self.queues):
            if part is not None:
                part.stop()
        if self.api is not None and self.chart_replicas:
            self.api.kubectl("-n", NAMESPACE, "scale", CHART_OPERATOR,
                             f"--replicas={self.chart_replicas}", check=False)  # fmt: skip
        if self._own_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if self._release is not None:
            self._release()

    def __enter__(self) -> KindStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the harness on this stack -------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        assert self.api is not None, "the stack is not started"
        return self.api.admin

    def operator_log(self, lines: int = 20) -> str:
        if self.operator is not None:
            return self.operator.tail(lines)
        return super().operator_log(lines)

    def claim_dir(self, claim: str, *, ns: str | None = None, timeout_s: float = 180) -> Path:
        """This machine's folder of a ``ddp-shared`` claim (every machine mounts the same one);
        the claim binds when its first pod is scheduled, so this waits for that."""

        def bound() -> str | None:
            return str(self.get("pvc", claim, ns=ns).get("spec", {}).get("volumeName", "")) or None

        self.until(f"claim {claim} bound", bound, timeout_s, ns=ns)
        return kind.claim_folder(self, claim, ns=ns)
