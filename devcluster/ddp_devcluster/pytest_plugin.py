"""pytest fixtures for the embedded control plane: ``-p ddp_devcluster.pytest_plugin``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import NoReturn

import pytest

from .plane import ControlPlane


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """One control plane for the whole session, with two kwok nodes."""
    nodes = int(os.environ.get("DDP_DEVCLUSTER_NODES", "2"))
    with ControlPlane(nodes=nodes, log=lambda m: print(f"\n[devcluster] {m}")) as cp:
        yield cp


def unavailable(reason: str) -> NoReturn:
    """Skips a test that this machine cannot run, except in CI (``CI`` set), where it fails:
    a CI run that skipped the end-to-end tests would prove nothing."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must run this test)")
    pytest.skip(reason)
