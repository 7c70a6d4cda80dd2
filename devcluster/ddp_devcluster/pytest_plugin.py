"""pytest fixtures for the embedded control plane: ``-p ddp_devcluster.pytest_plugin``."""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterator
from typing import NoReturn

import pytest

from .plane import ControlPlane


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """One control plane for the whole session, with two kwok nodes."""
    nodes = int(os.environ.get("DDP_DEVCLUSTER_NODES", "2"))
    with ControlPlane(nodes=nodes, log=lambda m: print(f"\n[devcluster] {m}")) as cp:
        yield cp


_last_use: dict[str, Callable[[], None]] = {}  # fixture name -> its release, while it runs


def until_last_use(fixture: str, release: Callable[[], None]) -> Callable[[], None]:
    """Makes a session fixture's ``release`` run right after the last test that uses it (so
    the tests after it do not share the two cores with an idle cluster, and the next real
    node never overlaps it); returns what the fixture calls at its own teardown: ``release``,
    unless it ran already."""
    _last_use[fixture] = release

    def finish() -> None:
        if _last_use.pop(fixture, None) is not None:
            release()

    return finish


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    yield
    used = [f for f in _last_use if f in getattr(item, "fixturenames", ())]
    if not used:
        return
    later = item.session.items[item.session.items.index(item) + 1 :]
    for fixture in used:
        if not any(fixture in getattr(i, "fixturenames", ()) for i in later):
            _last_use.pop(fixture)()


def unavailable(reason: str) -> NoReturn:
    """Skips a test that this machine cannot run, except in CI (``CI`` set), where it fails:
    a CI run that skipped the end-to-end tests would prove nothing."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must run this test)")
    pytest.skip(reason)
