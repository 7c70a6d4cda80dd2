"""The end-to-end stack, one for the whole tier and stopped right after its last test (one real
node at a time: the node's image store is shared only by nodes that do not overlap): the
embedded control plane, one real node whose containerd runs every pod the operator creates
from the trainer image that `make images` built, real Kueue beside it, and the operator as a
process of the checkout's code (``DDP_KUEUE=true``: only jobs labelled with a LocalQueue wait
for Kueue) under its manifests' RBAC. Each scenario has its own namespace, deleted after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2e_scenario import Scenario, local_stack

from ddp_devcluster.pytest_plugin import until_last_use
from ddp_devcluster.stack import LocalStack


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    s = local_stack(tmp_path_factory, "stack", kueue=True)
    finish = until_last_use("stack", s.stop)
    yield s
    finish()


@pytest.fixture
def sc(stack: LocalStack) -> Iterator[Scenario]:
    scenario = Scenario(stack)
    yield scenario  # (the stack is stopped after this, never before: see until_last_use)
    stack.kubectl("delete", "namespace", scenario.ns, "--wait=false", check=False)
