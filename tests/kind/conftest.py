"""The kind cluster of `make up`, once per session (``kind_cluster``): created here unless one
is up already, and then deleted after the last test that uses it, so that the tests after it
do not share the two cores with four idle nodes."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator

import pytest
from kind_env import KindCluster, requirements

from ddp_devcluster.kind import cluster

FIXTURE = "kind_cluster"
_release: list[Callable[[], None]] = []  # set while the cluster runs


def _log(msg: str) -> None:
    print(f"\n[kind] {msg}", flush=True)


@pytest.fixture(scope="session")
def kind_cluster() -> Iterator[KindCluster]:
    requirements()
    ours = not cluster.exists()
    kubeconfig = cluster.up(log=_log)

    def release() -> None:
        _release.clear()
        if ours:
            cluster.down(log=_log)

    _release.append(release)
    yield KindCluster(kubeconfig)
    if _release:
        release()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    yield
    if not _release or FIXTURE not in getattr(item, "fixturenames", ()):
        return
    later = item.session.items[item.session.items.index(item) + 1 :]
    if not any(FIXTURE in getattr(i, "fixturenames", ()) for i in later):
        _release[0]()
