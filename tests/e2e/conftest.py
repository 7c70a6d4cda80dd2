"""The end-to-end stack, one for the whole tier on the session's kind cluster (four machines;
tests/conftest.py's ``kind_cluster``) and stopped right after its last test: both images that
`make images` built, pulled by every machine from the registry on this host, every pod the
operator creates a container of the trainer image on one of the machines, real Kueue beside
the operator, and the operator as a process of the checkout's code on this machine
(``DDP_KUEUE=true``: only jobs labelled with a LocalQueue wait for Kueue) under its manifests'
RBAC. Each scenario has its own namespace, deleted after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2e_scenario import OPERATOR_ENV, Scenario

from ddp_devcluster.kind.stack import KindStack
from ddp_devcluster.pytest_plugin import until_last_use
from kind_env import KindCluster


@pytest.fixture(scope="session")
def stack(
    kind_cluster: KindCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KindStack]:
    s = KindStack(
        workdir=tmp_path_factory.mktemp("stack"),
        operator_env=OPERATOR_ENV,
        log=lambda m: print(f"\n[stack] {m}", flush=True),
        kueue=True,
    ).start()
    finish = until_last_use("stack", s.stop)
    yield s
    finish()


@pytest.fixture
def sc(stack: KindStack) -> Iterator[Scenario]:
    scenario = Scenario(stack)
    yield scenario  # (the stack is stopped after this, never before: see until_last_use)
    stack.kubectl("delete", "namespace", scenario.ns, "--wait=false", check=False)
