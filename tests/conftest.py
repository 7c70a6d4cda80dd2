from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from kubectl_plugin import KubectlDdp, install

if TYPE_CHECKING:
    from kind_env import KindCluster

pytest_plugins = ["ddp_devcluster.pytest_plugin"]


@pytest.fixture(scope="session")
def kubectl_ddp(tmp_path_factory: pytest.TempPathFactory) -> KubectlDdp:
    """``kubectl ddp`` from the built and installed project (tests/kubectl_plugin.py)."""
    return KubectlDdp(install(tmp_path_factory.mktemp("kubectl-ddp")))


@pytest.fixture(scope="session")
def kind_cluster() -> Iterator[KindCluster]:
    """The 4-machine kind cluster of `make up`, one for the session (tests/kind_env.py)."""
    from kind_env import session_cluster  # after this file registered the plugin it imports

    yield from session_cluster()
