"""The kind cluster of `make up`, once per session (``kind_cluster``): created here unless one
is up already, and then deleted after the last test that uses it, so that the tests after it
do not share the two cores with four idle nodes. It holds /tmp/ddp-node.lock while it runs, as
the real-node tests do."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Generator, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from kind_env import KindCluster, requirements

from ddp_devcluster.kind import cluster

NODE_LOCK = Path("/tmp/ddp-node.lock")
FIXTURE = "kind_cluster"
_release: list[Callable[[], None]] = []  # set while the cluster runs


def _held_by_caller(path: Path) -> bool:
    """Whether this process inherited an open file of ``path`` (``flock LOCK make test``):
    locking it again through a new open file would wait forever."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                return True
        except OSError:
            continue
    return False


def _log(msg: str) -> None:
    print(f"\n[kind] {msg}", flush=True)


@pytest.fixture(scope="session")
def kind_cluster() -> Iterator[KindCluster]:
    requirements()
    with ExitStack() as stack:
        if not _held_by_caller(NODE_LOCK):
            lock = stack.enter_context(NODE_LOCK.open("a"))
            fcntl.flock(lock, fcntl.LOCK_EX)
        ours = not cluster.exists()
        kubeconfig = cluster.up(log=_log)

        def release() -> None:
            _release.clear()
            if ours:
                cluster.down(log=_log)
            stack.close()  # the lock

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
