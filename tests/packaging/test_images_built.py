"""Both images built as they ship (``make images``: buildah, local stand-in bases) and run with
podman under runc: the operator's kopf and handlers as uid 10001, a two-process torchrun of
the trainer over gloo as uid 1000, and buildah's layer cache rebuilding only the code layer
after a code change. The first run builds everything (minutes; the trainer image downloads
torch and its CUDA libraries from PyPI); later runs find the images cached."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from dockerfiles import REPO

from ddp_devcluster import images
from ddp_devcluster.pytest_plugin import unavailable

pytestmark = pytest.mark.timeout(3600)


def _missing() -> str | None:
    tools = [t for t in ("podman", "buildah", "runc", "debootstrap") if shutil.which(t) is None]
    if tools:
        return f"{', '.join(tools)} missing (`make host-packages`)"
    if os.geteuid() != 0:
        return "building the stand-in bases (debootstrap) and root storage need root"
    return None


@pytest.fixture(scope="module")
def refs() -> dict[str, str]:
    if reason := _missing():
        unavailable(reason)
    return images.ensure_images()


def podman_run(ref: str, *argv: str, entrypoint: str | None = None, timeout: float = 600) -> str:
    cmd = ["podman", "run", "--rm", "--network", "none", "--runtime", "runc"]
    if entrypoint:
        cmd += ["--entrypoint", entrypoint]
    proc = subprocess.run(
        [*cmd, ref, *argv],
        capture_output=True,
        text=True,
        env=images.podman_env(),
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, f"{argv}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_the_refs_are_what_the_chart_and_the_operator_run() -> None:
    from ddp_operator.render import OperatorConfig

    refs = images.default_refs()
    assert refs["trainer"] == OperatorConfig().default_image
    assert refs["operator"].startswith("ghcr.io/ddp-operator/operator:")


def test_the_operator_image_runs_kopf_and_the_handlers_as_10001(refs: dict[str, str]) -> None:
    ref = refs["operator"]
    assert "kopf" in podman_run(ref, "--version", entrypoint="kopf").lower()
    out = podman_run(
        ref,
        "-c",
        "import os, sys, importlib.util, ddp_operator.handlers, ddp_operator.crd;"
        "print(os.getuid(), os.getgid(), sys.version_info[:2]);"
        "print(importlib.util.find_spec('torch'));"
        "print(ddp_operator.handlers.__file__)",
        entrypoint="python",
    )
    assert out.splitlines() == ["10001 10001 (3, 11)", "None", "/opt/app/ddp_operator/handlers.py"]
    # The image's own ENTRYPOINT, with --help for CMD: the flags kopf is started with exist.
    assert "--liveness" in podman_run(ref, "--help")


def test_the_trainer_image_trains_on_gloo_with_two_processes_as_1000(
    refs: dict[str, str],
) -> None:
    ref = refs["trainer"]
    script = (
        "set -e; id -u; id -g;"
        "python -c 'import torch, torch.distributed as d; print(torch.__version__, "
        "d.is_gloo_available())';"
        "torchrun --standalone --nproc-per-node 2 -m ddp_trainer --workload synthetic"
        " --synthetic-samples 256 --synthetic-dim 8 --synthetic-hidden 16 --max-steps 4"
        " --global-batch-size 32 --device cpu --checkpoint-dir /checkpoints/run >&2;"
        "tail -n 1 /checkpoints/run/metrics.jsonl"
    )
    out = podman_run(ref, "bash", "-c", script, timeout=900).splitlines()
    assert out[:2] == ["1000", "1000"]
    assert out[2].endswith(" True"), out[2]
    last = json.loads(out[-1])
    assert last["step"] == 4 and last["worldSize"] == 2, last


@pytest.fixture
def context_copy(tmp_path: Path) -> Iterator[Path]:
    """The build context as .dockerignore lets it through, plus both Dockerfiles."""
    ctx = tmp_path / "ctx"
    for d in ("api/ddp_api", "operator/ddp_operator", "trainer_image/ddp_trainer"):
        shutil.copytree(REPO / d, ctx / d, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (ctx / "requirements").mkdir()
    for lock in (REPO / "requirements").glob("*.lock"):
        shutil.copy2(lock, ctx / "requirements" / lock.name)
    for f in ("Dockerfile", ".dockerignore", "trainer_image/Dockerfile"):
        shutil.copy2(REPO / f, ctx / f)
    yield ctx


def test_a_code_change_rebuilds_only_the_code_layers(
    refs: dict[str, str], context_copy: Path
) -> None:
    changed = context_copy / "operator" / "ddp_operator" / "_layer_cache_probe.py"
    changed.write_text(f"PROBE = {os.getpid()}\n")
    (b,) = [x for x in images.builds(refs, repo=context_copy) if x.name == "operator"]
    probe = images.ImageBuild(b.name, "localhost/ddp-operator-layer-probe:test", b.dockerfile)
    try:
        lines = images.build_image(probe, context=context_copy)
    finally:
        subprocess.run(["podman", "rmi", "-f", probe.ref], env=images.podman_env(),
                       capture_output=True, check=False)  # fmt: skip
    steps = steps_cached(lines)
    deps = [s for s in steps if "uv pip sync" in s]
    code = [s for s in steps if s.startswith("COPY operator/ddp_operator")]
    assert deps and all(steps[s] for s in deps), steps
    assert code and not any(steps[s] for s in code), steps


def steps_cached(lines: list[str]) -> dict[str, bool]:
    """buildah's output -> each step's instruction: whether it came from the layer cache."""
    out: dict[str, bool] = {}
    current = None
    for line in lines:
        if m := re.match(r"^(?:\[\d+/\d+\] )?STEP \d+/\d+: (.*)", line):
            current = m.group(1)
            out[current] = False
        elif current and line.startswith("--> Using cache"):
            out[current] = True
    return out


def test_an_image_is_saved_as_an_archive_that_ctr_names_by_its_ref(
    refs: dict[str, str], tmp_path: Path
) -> None:
    """``ctr -n k8s.io images import`` names a docker-archive's image by manifest.json's
    RepoTags: it must hold the full ref the chart runs."""
    ref = refs["operator"]
    path = images.save_archive(ref, tmp_path / "operator.tar")
    with tarfile.open(path) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        names = set(tar.getnames())
    assert [m["RepoTags"] for m in manifest] == [[ref]]
    assert set(manifest[0]["Layers"]) <= names and manifest[0]["Config"] in names
    oci = images.save_oci_archive(ref, tmp_path / "operator-oci.tar")
    with tarfile.open(oci) as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
    assert len(index["manifests"]) == 1
