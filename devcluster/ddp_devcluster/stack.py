"""A whole cluster on this machine (development, tests and ``make demo``; root): the embedded
control plane, one real node (kubelet, containerd, runc: :mod:`ddp_devcluster.node`) with both
images that `make images` builds imported into it, and the operator.

The operator runs either as the Helm chart installs it (``chart=True``: its image, in a pod;
``make demo`` and tests/cluster), or as a process of the checkout's code beside the plane,
under the manifests' RBAC (tests/e2e, which kill and restart it and read its metrics).

    with LocalStack(chart=True) as s:
        s.kubectl("apply", "-f", "manifests/examples/digits.yaml")
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .kueue import KueueProcess, operator_rbac
from .node import RealNode
from .operator_process import NAMESPACE, REPO, SERVICE_ACCOUNT, OperatorProcess, install
from .plane import ControlPlane, binary
from .polling import until

EXAMPLES = REPO / "manifests" / "examples"
CHART = REPO / "helm" / "ddp-operator"


def helm_install_args(
    operator_ref: str, trainer_ref: str, pull_policy: str, kueue: bool = False
) -> list[str]:
    """``helm upgrade --install`` of the chart with these images: installs it, or moves an
    installed release to these images and values (pure)."""
    repo, tag = operator_ref.rsplit(":", 1)
    return [
        "upgrade", "--install", "ddp-operator", str(CHART), "--namespace", NAMESPACE,
        "--create-namespace", "--set", f"image.repository={repo}", "--set", f"image.tag={tag}",
        "--set", f"image.pullPolicy={pull_policy}", "--set", f"trainerImage={trainer_ref}",
        "--set", "settings.backoffBaseSeconds=2", "--set", f"kueue.enabled={str(kueue).lower()}",
        "--wait", "--timeout", "5m",
    ]  # fmt: skip


def helm() -> str:
    return shutil.which("helm") or str(binary("helm"))


def install_chart(
    kubeconfig: Path,
    operator_ref: str,
    trainer_ref: str,
    pull_policy: str,
    kueue: bool = False,
    values: Sequence[str] = (),
) -> str:
    """Installs or upgrades the release; ``values`` are more ``--set`` pairs (``key=value``)."""
    argv = [helm(), "--kubeconfig", str(kubeconfig)]
    argv += helm_install_args(operator_ref, trainer_ref, pull_policy, kueue)
    argv += [a for v in values for a in ("--set", v)]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"helm install failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return proc.stdout


class JobWatch:
    """kubectl and waiting on DDPJobs, for any stack with a ``plane``."""

    plane: ControlPlane | None

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        assert self.plane is not None
        return self.plane.kubectl(*args, check=check, input=input)

    def job(self, name: str, namespace: str = "default") -> dict[str, Any]:
        out = self.kubectl("get", "ddpjob", name, "-n", namespace, "-o", "json", check=False)
        return json.loads(out.stdout) if out.returncode == 0 else {}

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

    def pod_containers(self, namespace: str) -> list[tuple[str, str]]:
        out = self.kubectl(
            "get",
            "pods",
            "-n",
            namespace,
            "-o",
            'jsonpath={range .items[*]}{.metadata.name} {.spec.containers[*].name}{"\\n"}{end}',
            check=False,
        ).stdout
        rows = [row.split() for row in str(out).splitlines() if row.strip()]
        return [(pod, c) for pod, *containers in rows for c in containers]


@dataclass
class LocalStack(JobWatch):
    workdir: Path | None = None
    # The operator from `helm install` of the chart with the built operator image; else a
    # process of the checkout's code, with ``operator_env`` added to its environment.
    chart: bool = False
    operator_env: dict[str, str] = field(default_factory=dict)
    log: Callable[[str], None] = print
    # Real Kueue beside the operator, which runs with the chart's kueue.enabled RBAC.
    kueue: bool = False

    plane: ControlPlane | None = field(default=None, init=False)
    node: RealNode | None = field(default=None, init=False)
    operator: OperatorProcess | None = field(default=None, init=False)
    queues: KueueProcess | None = field(default=None, init=False)
    refs: dict[str, str] = field(default_factory=dict, init=False)
    _own_workdir: bool = field(default=False, init=False)

    def start(self) -> LocalStack:
        from . import images

        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="ddp-stack-"))
            self._own_workdir = True
        self.refs = images.ensure_images(log=self.log)
        self.node = RealNode(
            images=[self.refs["operator"], self.refs["trainer"]],
            helper_image=images.PYTHON_BASE,
            log=self.log,
        )
        try:
            lay = self.node.prepare()
            self.plane = ControlPlane(
                nodes=0,
                workdir=self.workdir / "plane",
                advertise_address=lay.host_ip,
                log=self.log,
            )
            self.plane.start()
            self.node.start(self.plane)
            if self.kueue:
                self.queues = KueueProcess(self.plane, self.workdir / "kueue").start()
            if self.chart:
                self.log("helm install ddp-operator (the chart, with the built operator image)")
                install_chart(
                    self.plane.kubeconfig,
                    self.refs["operator"],
                    self.refs["trainer"],
                    "Never",
                    self.kueue,
                )
            else:
                self._start_operator_process()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_operator_process(self) -> None:
        assert self.plane is not None and self.workdir is not None
        install(self.plane)
        env = {"DDP_DEFAULT_IMAGE": self.refs["trainer"], **self.operator_env}
        if self.kueue:
            for doc in operator_rbac(SERVICE_ACCOUNT, NAMESPACE):
                self.plane.kubectl("apply", "-f", "-", input=json.dumps(doc))
            env["DDP_KUEUE"] = "true"
        self.operator = OperatorProcess(self.plane, self.workdir / "operator", env).start()

    def stop(self) -> None:
        for part in (self.operator, self.queues, self.node, self.plane):
            if part is not None:
                part.stop()
        if self._own_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- conveniences ------------------------------------------------------------------------
    def claim_dir(self, claim: str, namespace: str = "default", timeout_s: float = 180) -> Path:
        """The node's folder behind a PersistentVolumeClaim (local-path-provisioner's), which
        the host sees as it is. The default class binds a claim when its first pod is
        scheduled, so this waits for that."""

        def bound() -> str | None:
            return (
                self.kubectl(
                    "get", "pvc", claim, "-n", namespace, "-o", "jsonpath={.spec.volumeName}"
                ).stdout.strip()
                or None
            )

        volume = until(f"claim {namespace}/{claim} bound", bound, timeout_s, 0.5)
        pv = json.loads(self.kubectl("get", "pv", volume, "-o", "json").stdout)["spec"]
        return Path((pv.get("hostPath") or pv.get("local") or {})["path"])

    def logs(self, namespace: str, pod: str, container: str) -> str:
        return self.kubectl("logs", "-n", namespace, pod, "-c", container, check=False).stdout

    def operator_tail(self, lines: int = 20) -> str:
        if self.operator is not None:
            return self.operator.tail(lines)
        return self.kubectl(
            "logs", "-n", NAMESPACE, "deploy/ddp-operator", f"--tail={lines}", check=False
        ).stdout

    def diagnostics(self, namespace: str = "default", lines: int = 25) -> str:
        """What to read when something failed: pods, events, the operator's and pods' logs."""
        parts = [
            self.kubectl("get", "ddpj,pods", "-n", namespace, "-o", "wide", check=False).stdout,
            self.kubectl(
                "get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False
            ).stdout[-4000:],
            "operator log:\n" + self.operator_tail(),
        ]
        for pod, c in self.pod_containers(namespace):
            text = self.logs(namespace, pod, c).splitlines()[-lines:]
            parts.append(f"log of {pod}/{c} (last {lines} lines):\n" + "\n".join(text))
        return "\n".join(parts)
