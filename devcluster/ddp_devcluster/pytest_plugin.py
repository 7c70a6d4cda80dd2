"""pytest fixtures for the embedded control plane: ``-p ddp_devcluster.pytest_plugin``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from .kubelet import TestKubelet
from .plane import ControlPlane

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """One control plane for the whole session, with two kwok nodes."""
    nodes = int(os.environ.get("DDP_DEVCLUSTER_NODES", "2"))
    with ControlPlane(nodes=nodes, log=lambda m: print(f"\n[devcluster] {m}")) as cp:
        yield cp


@pytest.fixture(scope="session")
def test_kubelet(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TestKubelet]:
    """A test kubelet running real processes for the pods of nodes ``tk-0`` and ``tk-1``
    (labelled ``ddp.dev/test-kubelet=true``) on the session's control plane. The plane's
    kwok nodes stay: pin pods with ``nodeSelector`` or ``nodeName``."""
    nodes = int(os.environ.get("DDP_TEST_KUBELET_NODES", "2"))
    with TestKubelet(
        control_plane,
        nodes=[f"tk-{i}" for i in range(nodes)],
        state_dir=tmp_path_factory.mktemp("test-kubelet"),
        python_path=[REPO / d for d in ("operator", "trainer_image", "devcluster")],
        log=lambda m: print(f"\n[test-kubelet] {m}"),
    ) as tk:
        yield tk


def unavailable(reason: str) -> NoReturn:
    """Skips a test that this machine cannot run, except in CI (``CI`` set), where it fails:
    a CI run that skipped the end-to-end tests would prove nothing."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must run this test)")
    pytest.skip(reason)
