"""The end-to-end stack, one for the session: the embedded control plane (no kwok nodes), the
operator under its manifests' RBAC, and the test kubelet, which runs every pod the operator
creates as real processes in their own network namespaces."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2e_scenario import Scenario

from ddp_devcluster.pytest_plugin import unavailable
from ddp_devcluster.stack import LocalStack


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with LocalStack(
        nodes=3,
        workdir=tmp_path_factory.mktemp("stack"),
        operator_env={"DDP_BACKOFF_BASE_S": "1", "DDP_RESYNC_S": "5"},
        log=lambda m: print(f"\n[stack] {m}"),
    ) as s:
        if s.kubelet is not None and s.kubelet.mode != "netns":
            unavailable("the test kubelet has no network namespaces here (needs root)")
        yield s


@pytest.fixture
def sc(stack: LocalStack) -> Scenario:
    return Scenario(stack)
