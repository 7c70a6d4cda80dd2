from __future__ import annotations

from collections.abc import Callable, Iterator
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


def _kind_log(config: pytest.Config) -> Callable[[str], None]:
    capture = config.pluginmanager.getplugin("capturemanager")

    def log(msg: str) -> None:  # shown as it happens (minutes of pulls, or of waiting)
        with capture.global_and_fixture_disabled():
            print(f"\n[kind] {msg}", flush=True)

    return log


def pytest_collection_finish(session: pytest.Session) -> None:
    """A session with tests on the kind cluster waits for its turn here, before any test's
    timeout runs: another session or the demo may hold the cluster for many minutes."""
    if any("kind_cluster" in getattr(i, "fixturenames", ()) for i in session.items):
        from kind_env import take_turn

        take_turn(_kind_log(session.config))


@pytest.fixture(scope="session")
def kind_cluster(pytestconfig: pytest.Config) -> Iterator[KindCluster]:
    """The 4-machine kind cluster of `make up`, one for the session (tests/kind_env.py)."""
    from kind_env import session_cluster  # after this file registered the plugin it imports

    yield from session_cluster(_kind_log(pytestconfig))
