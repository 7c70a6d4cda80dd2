"""The kind cluster as the tests see it (the harness on its kubeconfig), and what this machine
must have to run it."""

from __future__ import annotations

from ddp_devcluster.harness import Harness
from ddp_devcluster.kind import cluster as kind
from ddp_devcluster.pytest_plugin import unavailable


class KindCluster(Harness):
    """The harness on the kind cluster's kubeconfig."""

    timeout_s = 120


def requirements() -> None:
    why = kind.requirements()
    if why:
        unavailable(f"the kind cluster cannot start here: {why}")
