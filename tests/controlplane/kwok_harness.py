"""The harness as the control-plane tests use it: one fresh namespace of the embedded plane,
whose pods kwok runs and ends on an annotation (``kwok.ddp.dev/exit-code``), with the operator
as a process beside it."""

from __future__ import annotations

import uuid
from typing import Any

from ddp_api.contract import API_VERSION, KIND, PLURAL
from ddp_devcluster.harness import Harness
from ddp_devcluster.operator_process import OperatorProcess
from ddp_devcluster.plane import ControlPlane
from ddp_operator.kube import group_path

EXIT = "kwok.ddp.dev/exit-code"


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    """A pod's first container's environment: name -> value (or valueFrom)."""
    return {
        e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]
    }


class KwokNamespace(Harness):
    timeout_s = 30
    interval_s = 0.2
    pod_log_lines = 0  # kwok's pods have no logs

    def __init__(self, cp: ControlPlane, op: OperatorProcess, prefix: str = "t"):
        super().__init__(cp.kubeconfig, f"{prefix}-{uuid.uuid4().hex[:8]}")
        self.cp, self.op = cp, op
        self.k("create", "namespace", self.ns, ns="")

    @property
    def jobs_path(self) -> str:
        """The API path of the namespace's DDPJobs (``/apis/ddp.dev/v1alpha1/namespaces/...``)."""
        return group_path(API_VERSION, self.ns, PLURAL)

    def operator_log(self, lines: int = 20) -> str:
        return self.op.tail(lines)

    def kwok_log(self, pod: str) -> str:
        """kwok's lines about ``pod``: what it patched and deleted, and what it retried. kwok
        acts by name, with no uid precondition (a kubelet deletes with one), so a retried or
        late action for a pod can reach the pod made next under its name."""
        proc = self.cp.procs.get("kwok")
        key = f"{self.ns}/{pod}"
        lines = proc.tail(100_000).splitlines() if proc is not None else []
        return "\n".join(line for line in lines if key in line)

    def submit(self, name: str, spec: dict[str, Any], labels: dict[str, str] | None = None) -> None:
        """A DDPJob with an emptyDir checkpoint volume unless ``spec`` names one."""
        self.apply(
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "metadata": {"name": name, **({"labels": labels} if labels else {})},
                "spec": {"checkpoint": {"volume": {"emptyDir": {}}}, **spec},
            }
        )

    def exit(self, pod: str, code: int) -> None:
        """kwok ends the pod with this exit code (Succeeded for 0, else Failed)."""
        self.k("annotate", "pod", pod, f"{EXIT}={code}")

    def running(self, job: str, nodes: int, timeout_s: float | None = None) -> dict[str, Any]:
        """Waits until the job is Running with ``nodes`` ready nodes and as many node pods."""
        return self.until(
            f"{job} Running with {nodes} ready nodes",
            lambda: (
                (
                    (s := self.status(job)).get("phase") == "Running"
                    and s.get("readyNodes") == nodes
                    and len(self.workers(job)) == nodes
                    and s
                )
                or None
            ),
            timeout_s,
        )

    def succeed(self, job: str) -> dict[str, Any]:
        """Ends every node pod of the job with 0; its status once Succeeded."""
        for pod, p in self.workers(job).items():
            if not p["metadata"].get("deletionTimestamp"):
                self.exit(pod, 0)
        return self.phase(job, "Succeeded")
