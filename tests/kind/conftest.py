"""The kind cluster of `make up`, once per session (``kind_cluster``): created here unless one
is up already, and then deleted at the end. It holds /tmp/ddp-node.lock while it runs, as the
real-node tests do: four nodes keep both cores busy."""

from __future__ import annotations

import fcntl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kind_env import KindCluster, requirements

from ddp_devcluster.kind import cluster

NODE_LOCK = Path("/tmp/ddp-node.lock")


@pytest.fixture(scope="session")
def kind_cluster() -> Iterator[KindCluster]:
    requirements()
    with NODE_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ours = not cluster.exists()
        t0 = time.monotonic()
        kubeconfig = cluster.up(log=lambda m: print(f"\n[kind] {m}", flush=True))
        yield KindCluster(kubeconfig, time.monotonic() - t0 if ours else None)
        if ours:
            cluster.down(log=lambda m: print(f"\n[kind] {m}", flush=True))
