"""pytest fixtures for the embedded control plane: ``-p ddp_devcluster.pytest_plugin``."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from .plane import ControlPlane


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """One control plane for the whole session, with two kwok nodes."""
    nodes = int(os.environ.get("DDP_DEVCLUSTER_NODES", "2"))
    with ControlPlane(nodes=nodes, log=lambda m: print(f"\n[devcluster] {m}")) as cp:
        yield cp
