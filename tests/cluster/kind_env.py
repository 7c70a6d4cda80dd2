"""The kind cluster as the tests see it (the harness on its kubeconfig), and what this machine
must have to run it."""

from __future__ import annotations

import shutil
import subprocess

from ddp_devcluster.build import binary
from ddp_devcluster.harness import Harness
from ddp_devcluster.pytest_plugin import unavailable


class KindCluster(Harness):
    """The harness on the kind cluster's kubeconfig."""

    timeout_s = 120


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
