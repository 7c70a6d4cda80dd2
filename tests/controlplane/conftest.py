"""Fixtures shared by the control-plane tests."""

from __future__ import annotations

from pathlib import Path

import pytest

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
