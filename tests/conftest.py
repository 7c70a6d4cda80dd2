from __future__ import annotations

import pytest

from kubectl_plugin import KubectlDdp, install

pytest_plugins = ["ddp_devcluster.pytest_plugin"]


@pytest.fixture(scope="session")
def kubectl_ddp(tmp_path_factory: pytest.TempPathFactory) -> KubectlDdp:
    """``kubectl ddp`` from the built and installed project (tests/kubectl_plugin.py)."""
    return KubectlDdp(install(tmp_path_factory.mktemp("kubectl-ddp")))
