"""A whole cluster on this machine (development, tests and ``make demo``; root): the embedded
control plane, one real node (kubelet, containerd, runc: :mod:`ddp_devcluster.node`) with both
images that `make images` builds imported into it, and the operator.

The operator runs either as the Helm chart installs it (``chart=True``: its image, in a pod;
``make demo`` and tests/cluster), or as a process of the checkout's code beside the plane,
under the manifests' RBAC (tests/e2e, which kill and restart it and read its metrics).

    with LocalStack(chart=True) as s:
        s.apply_example("digits.yaml")
        s.phase("digits", "Succeeded", stall_s=300)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .harness import Harness
from .kueue import KueueProcess, operator_rbac
from .node import RealNode
from .operator_process import NAMESPACE, REPO, SERVICE_ACCOUNT, OperatorProcess, install
from .plane import ControlPlane, binary

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


@dataclass
class LocalStack(Harness):
    """The cluster, and the harness on it (:class:`~ddp_devcluster.harness.Harness`)."""

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

    # -- the harness on this stack -------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        assert self.plane is not None, "the stack is not started"
        return self.plane.kubeconfig

    def operator_log(self, lines: int = 20) -> str:
        if self.operator is not None:
            return self.operator.tail(lines)
        return super().operator_log(lines)

    def claim_dir(self, claim: str, *, ns: str | None = None, timeout_s: float = 180) -> Path:
        """The node's folder behind a PersistentVolumeClaim (local-path-provisioner's), which
        the host sees as it is. The default class binds a claim when its first pod is
        scheduled, so this waits for that."""

        def bound() -> str | None:
            return str(self.get("pvc", claim, ns=ns).get("spec", {}).get("volumeName", "")) or None

        volume = self.until(f"claim {claim} bound", bound, timeout_s, ns=ns)
        pv = self.get("pv", volume, check=True)["spec"]
        return Path((pv.get("hostPath") or pv.get("local") or {})["path"])
