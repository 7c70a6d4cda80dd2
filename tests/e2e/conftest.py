"""The end-to-end stack, one per test module (one real node at a time: the node's image store
is shared only by nodes that do not overlap): the embedded control plane, one real node whose
containerd runs every pod the operator creates from the trainer image that `make images`
built, and the operator as a process of the checkout's code under its manifests' RBAC."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2e_scenario import Scenario, local_stack

from ddp_devcluster.stack import LocalStack


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    yield from local_stack(tmp_path_factory, "stack")


@pytest.fixture
def sc(stack: LocalStack) -> Scenario:
    return Scenario(stack)
