"""Fixtures shared by the control-plane tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ddp_devcluster.operator_process import OperatorProcess, install
from ddp_devcluster.plane import ControlPlane

CRD_FILE = Path(__file__).resolve().parents[2] / "manifests" / "crd" / "ddp.dev_ddpjobs.yaml"
CRD_NAME = "ddpjobs.ddp.dev"


@pytest.fixture(scope="session")
def ddpjob_crd(control_plane: ControlPlane) -> ControlPlane:
    """The session's control plane with the committed DDPJob CRD applied and Established."""
    cp = control_plane
    cp.kubectl("apply", "-f", str(CRD_FILE))
    cp.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    return cp


@pytest.fixture(scope="module")
def operator(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """The operator as a process, one per test module, with the manifests' RBAC and CRD
    installed, quick backoff and resync, and ``trainer:test`` as the default image (kwok runs
    the pods). A module that needs other settings defines its own."""
    install(control_plane)
    env = {"DDP_BACKOFF_BASE_S": "1", "DDP_RESYNC_S": "2", "DDP_DEFAULT_IMAGE": "trainer:test"}
    with OperatorProcess(control_plane, tmp_path_factory.mktemp("operator"), env=env) as op:
        yield op
        print(op.tail(30))
