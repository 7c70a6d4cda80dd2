"""The operator as a real process of this machine against a cluster's API (the embedded control
plane, or the kind cluster's; development and tests).

It is installed from ``manifests/`` (CRD, namespace, RBAC) and runs under the manifests'
ServiceAccount with a TokenRequest token, so a permission missing from ``manifests/`` fails here
as it would in a cluster. It takes part in the operator's leader election as a replica in a pod
does: one identity for the object's life, kept across :meth:`OperatorProcess.kill` and
``start`` as a pod's name is across restarts of its container.
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ddp_api.contract import GROUP, PLURAL

from .managed import ManagedProcess, http_ok
from .paths import source_path
from .plane import MARKER_ENV, ClusterAPI, Process
from .procs import free_port

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
INSTALL = [
    MANIFESTS / "crd" / f"{GROUP}_{PLURAL}.yaml",
    MANIFESTS / "namespace.yaml",
    MANIFESTS / "rbac" / "operator.yaml",
    MANIFESTS / "rbac" / "trainer-progress.yaml",
]
NAMESPACE = "ddp-system"
SERVICE_ACCOUNT = "ddp-operator"


def install(plane: ClusterAPI) -> None:
    """Applies the CRD, the operator's namespace and its RBAC (with the trainers' ClusterRole
    and admission policy), and waits for the CRD."""
    for path in INSTALL:
        plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    plane.kubectl("wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=60s")


@dataclass
class OperatorProcess(ManagedProcess):
    """``kopf run`` of ``ddp_operator.handlers`` in a child process, watching ``namespaces``
    (all when empty) as ServiceAccount ``service_account`` of the operator's namespace."""

    plane: ClusterAPI
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    namespaces: list[str] = field(default_factory=list)
    service_account: str = SERVICE_ACCOUNT
    process: Process | None = None
    health_port: int = 0
    metrics_port: int = 0
    identity: str = field(default_factory=lambda: f"operator-{uuid.uuid4().hex[:8]}")
    name = "ddp-operator"
    tail_lines = 60

    @property
    def log(self) -> Path:
        return self.workdir / "operator.log"

    def start(self, timeout_s: float = 60.0) -> OperatorProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        kubeconfig = self.plane.token_kubeconfig(
            NAMESPACE, self.service_account, self.workdir / "operator.kubeconfig"
        )
        self.health_port = free_port()
        self.metrics_port = free_port()
        env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "PYTHONPATH": source_path(),
            "PYTHONUNBUFFERED": "1",
            MARKER_ENV: self.plane.marker,
            "DDP_METRICS_PORT": str(self.metrics_port),
            "DDP_LEADER_IDENTITY": self.identity,
            **self.env,
        }
        argv = [
            sys.executable,
            "-m",
            "kopf",
            "run",
            "--standalone",
            *([f"--namespace={ns}" for ns in self.namespaces] or ["--all-namespaces"]),
            "--log-format=json",
            f"--liveness=http://127.0.0.1:{self.health_port}/healthz",
            "-m",
            "ddp_operator.handlers",
        ]
        self.launch(argv, env)
        self.wait_for(self.healthy, "the operator's /healthz", timeout_s)
        return self

    def healthy(self) -> bool:
        return http_ok(f"http://127.0.0.1:{self.health_port}/healthz")

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def kill(self) -> None:
        """SIGKILL, as a crash or an evicted pod would end it: no cleanup runs."""
        if self.process is not None and self.process.popen is not None:
            os.killpg(self.process.popen.pid, signal.SIGKILL)
            self.process.popen.wait()

    def pid(self) -> int:
        assert self.process is not None and self.process.popen is not None
        return self.process.popen.pid
