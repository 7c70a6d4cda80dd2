"""The kind cluster as the tests see it: kubectl on its kubeconfig, waits that show the pods
and events on failure, and what this machine must have to run it."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddp_devcluster.build import binary
from ddp_devcluster.kind import cluster
from ddp_devcluster.polling import until
from ddp_devcluster.pytest_plugin import unavailable


@dataclass
class KindCluster:
    kubeconfig: Path

    def k(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return cluster.kubectl(self.kubeconfig, *args, input=input, check=check)

    def get(self, *args: str) -> dict[str, Any]:
        out = self.k("get", *args, "-o", "json", check=False)
        return json.loads(out) if out else {}

    def apply(self, *objs: dict[str, Any]) -> None:
        listing = {"apiVersion": "v1", "kind": "List", "items": list(objs)}
        self.k("apply", "-f", "-", input=json.dumps(listing))

    def until(self, what: str, probe: Any, timeout_s: float = 120, ns: str = "") -> Any:
        def detail() -> str:
            where = ["-n", ns] if ns else ["-A"]
            return self.k("get", "pods,pvc,events", *where, "-o", "wide", check=False)

        return until(what, probe, timeout_s=timeout_s, interval_s=0.5, detail=detail)


def requirements() -> None:
    missing = [c for c in ("podman", "buildah", "go", "gcc") if not shutil.which(c)]
    if missing:
        unavailable(f"the kind cluster needs {', '.join(missing)} (make host-packages)")
    for tool, name in (("kind", "kind"), ("registry", "registry"), ("kubernetes-node", "kubeadm")):
        try:
            binary(tool, name)
        except FileNotFoundError as e:
            unavailable(str(e))
    if subprocess.run(["podman", "info"], capture_output=True, check=False).returncode != 0:
        unavailable("podman cannot run containers here")
