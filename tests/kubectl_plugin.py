"""``kubectl ddp`` as a user gets it: this project built into a wheel, installed into a fresh
virtual environment, and found by kubectl as the plugin ``kubectl-ddp`` on PATH.

The fresh environment reaches its dependencies (kubernetes, matplotlib, ...) through a .pth
file naming the development environment's site-packages: there is no package index here. The
repository itself is never on its path, so the installed package is what runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from ddp_devcluster.paths import cache_dir
from ddp_devcluster.plane import kubectl_path

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "api", "client")


def _uv() -> Path:
    version = re.search(r"^UV_VERSION := (\S+)$", (REPO / "Makefile").read_text(), re.M)
    assert version, "the Makefile pins UV_VERSION"
    path = cache_dir() / f"uv-{version.group(1)}" / "bin" / "uv"
    assert path.is_file(), f"{path} is missing: `make venv` installs it"
    return path


def _run(argv: list[str], cwd: Path | None = None) -> None:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"{argv}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def install(workdir: Path) -> Path:
    """Builds the wheel from a copy of the sources and installs it; returns the venv's bin."""
    src, dist, venv = workdir / "src", workdir / "dist", workdir / "venv"
    src.mkdir(parents=True)
    for name in SOURCES:
        if (REPO / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
            shutil.copytree(REPO / name, src / name, ignore=ignore)
        else:
            shutil.copy2(REPO / name, src / name)
    uv = str(_uv())
    _run([uv, "build", "-q", "--wheel", "--offline", "--no-build-isolation",
          "--python", sys.executable, "--out-dir", str(dist)], cwd=src)  # fmt: skip
    (wheel,) = dist.glob("ddp_operator-*.whl")
    _run([uv, "venv", "-q", "--python", sys.executable, str(venv)])
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "ddp-dev-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run(
        [uv, "pip", "install", "-q", "--offline", "--no-deps", "--python", str(python), str(wheel)]
    )
    return venv / "bin"


@dataclass
class KubectlDdp:
    """Runs ``kubectl ddp ARGS`` with the installed plugin first on PATH."""

    bin_dir: Path
    kubeconfig: Path | None = None

    def env(self, kubeconfig: Path | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["PATH"] = os.pathsep.join([str(self.bin_dir), env.get("PATH", "")])
        config = kubeconfig or self.kubeconfig
        if config is not None:
            env["KUBECONFIG"] = str(config)
        return env

    def argv(self, *args: str) -> list[str]:
        return [kubectl_path(), "ddp", *args]

    def __call__(
        self, *args: str, kubeconfig: Path | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args),
            env=self.env(kubeconfig),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def start(self, *args: str, kubeconfig: Path | None = None) -> subprocess.Popen[str]:
        """``kubectl ddp ARGS`` in the background (e.g. ``watch`` while a test acts)."""
        return subprocess.Popen(
            self.argv(*args),
            env=self.env(kubeconfig),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
