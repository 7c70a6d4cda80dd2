"""podman and buildah as the dev cluster runs them: with the project's containers.conf
(``$CONTAINERS_CONF``: no default ulimits, which this sandbox cannot set), output captured."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONTAINERS_CONF = REPO / "devcluster" / "containers.conf"


def podman_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for podman and buildah: the project's containers.conf unless the caller
    set ``CONTAINERS_CONF`` already."""
    env = dict(os.environ if base is None else base)
    env.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))
    return env


def run(argv: list[str], *, check: bool = False) -> subprocess.CompletedProcess[str]:
    """``argv`` in :func:`podman_env`, its output captured as text (``check``: raise
    CalledProcessError when it fails)."""
    return subprocess.run(
        argv, capture_output=True, text=True, errors="replace", env=podman_env(), check=check
    )


def podman(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    """``podman args`` as :func:`run` runs it."""
    return run(["podman", *args], check=check)


def run_checked(argv: list[str]) -> str:
    """:func:`run`'s stdout; RuntimeError with the end of stderr when ``argv`` fails."""
    proc = run(argv)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout


def podman_checked(*args: str) -> str:
    """``podman args``' stdout; RuntimeError with the end of stderr when it fails."""
    return run_checked(["podman", *args])


def image_id(ref: str) -> str | None:
    """The id of image ``ref`` in podman's storage; None when it is not there."""
    proc = podman("image", "inspect", "--format", "{{.Id}}", ref)
    return proc.stdout.strip() if proc.returncode == 0 else None
