"""A whole cluster on this machine: the embedded control plane with no kwok nodes, the test
kubelet running pods as real processes, and the operator (development, tests, ``make demo``).

    with LocalStack(nodes=3) as s:
        s.kubectl("apply", "-f", "manifests/examples/checkpoint-pvc.yaml", ...)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .kubelet import TestKubelet
from .kueue import KueueProcess, operator_rbac
from .operator_process import NAMESPACE, REPO, SERVICE_ACCOUNT, OperatorProcess, install
from .plane import ControlPlane

EXAMPLES = REPO / "manifests" / "examples"


@dataclass
class LocalStack:
    nodes: int = 3
    workdir: Path | None = None
    operator_env: dict[str, str] = field(default_factory=dict)
    log: Callable[[str], None] = print
    # Real Kueue beside the operator, which runs with the chart's kueue.enabled RBAC.
    kueue: bool = False

    plane: ControlPlane | None = field(default=None, init=False)
    kubelet: TestKubelet | None = field(default=None, init=False)
    operator: OperatorProcess | None = field(default=None, init=False)
    queues: KueueProcess | None = field(default=None, init=False)
    _own_workdir: bool = field(default=False, init=False)

    def start(self) -> LocalStack:
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="ddp-stack-"))
            self._own_workdir = True
        try:
            self.plane = ControlPlane(nodes=0, workdir=self.workdir / "plane", log=self.log)
            self.plane.start()
            install(self.plane)
            self.kubelet = TestKubelet(
                self.plane,
                nodes=[f"node-{i}" for i in range(self.nodes)],
                state_dir=self.workdir / "kubelet",
                python_path=[REPO / d for d in ("operator", "trainer_image", "devcluster")],
                log=self.log,
            ).start()
            env = {"DDP_DEFAULT_IMAGE": "ddp-trainer:local", **self.operator_env}
            if self.kueue:
                self.queues = KueueProcess(self.plane, self.workdir / "kueue").start()
                for doc in operator_rbac(SERVICE_ACCOUNT, NAMESPACE):
                    self.plane.kubectl("apply", "-f", "-", input=json.dumps(doc))
                env["DDP_KUEUE"] = "true"
            self.operator = OperatorProcess(self.plane, self.workdir / "operator", env).start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for part in (self.operator, self.queues, self.kubelet, self.plane):
            if part is not None:
                part.stop()
        if self._own_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- conveniences ------------------------------------------------------------------------
    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        assert self.plane is not None
        return self.plane.kubectl(*args, check=check, input=input)

    def job(self, name: str, namespace: str = "default") -> dict[str, Any]:
        out = self.kubectl("get", "ddpjob", name, "-n", namespace, "-o", "json", check=False)
        return json.loads(out.stdout) if out.returncode == 0 else {}

    def claim_dir(self, claim: str, namespace: str = "default") -> Path:
        """The host folder behind a PersistentVolumeClaim (shared by all pods that mount it)."""
        assert self.kubelet is not None
        return self.kubelet.state_dir / "pvc" / namespace / claim

    def wait_for_phase(
        self,
        name: str,
        phases: tuple[str, ...],
        stall_s: float,
        namespace: str = "default",
        on_status: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Polls the job's status until its phase is one of ``phases``; returns the status.

        Gives up (TimeoutError) only when the status has not moved for ``stall_s`` seconds (no
        new phase, step or ready count), so a slow or busy machine is no failure, a stuck job is.
        """
        status: dict[str, Any] = {}
        seen: tuple[Any, ...] = ()
        moved = time.monotonic()
        while time.monotonic() - moved < stall_s:
            status = self.job(name, namespace).get("status") or {}
            if on_status is not None:
                on_status(status)
            if status.get("phase") in phases:
                return status
            now = (
                status.get("phase"),
                status.get("readyNodes"),
                (status.get("progress") or {}).get("step"),
            )
            if now != seen:
                seen, moved = now, time.monotonic()
            time.sleep(0.5)
        raise TimeoutError(
            f"{name} did not reach {'/'.join(phases)}: its status did not move for"
            f" {stall_s:.0f}s; status: {status}"
        )

    def diagnostics(self, namespace: str = "default") -> str:
        """What to read when something failed: pods, events, operator and kubelet logs."""
        parts = [
            self.kubectl("get", "ddpj,pods", "-n", namespace, "-o", "wide", check=False).stdout,
            self.kubectl(
                "get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False
            ).stdout[-4000:],
        ]
        if self.operator is not None:
            parts.append("operator log:\n" + self.operator.tail(20))
        if self.kubelet is not None:
            try:
                agent = self.kubelet.agent_log.read_text(errors="replace").splitlines()[-20:]
            except OSError:
                agent = []
            parts.append("test kubelet log:\n" + "\n".join(agent))
            parts += self._pod_log_tails(namespace)
        return "\n".join(parts)

    def _pod_log_tails(self, namespace: str, lines: int = 25) -> list[str]:
        """The last lines of every container of the namespace's pods (what the trainer said)."""
        assert self.kubelet is not None
        out = self.kubectl(
            "get",
            "pods",
            "-n",
            namespace,
            "-o",
            'jsonpath={range .items[*]}{.metadata.name} {.spec.containers[*].name}{"\\n"}{end}',
            check=False,
        ).stdout
        tails = []
        for row in str(out).splitlines():
            pod, *containers = row.split()
            for c in containers:
                text = self.kubelet.logs(namespace, pod, c).splitlines()[-lines:]
                tails.append(f"log of {pod}/{c} (last {lines} lines):\n" + "\n".join(text))
        return tails
