"""Build both shipped images with buildah, without any registry (``make images``).

The Dockerfiles are built as they ship. Their two base images, ``python:3.11-slim-bookworm``
and ``ghcr.io/astral-sh/uv:<UV_VERSION>``, cannot be pulled here, so local stand-ins are
tagged with exactly those names first:

- python: a ``debootstrap --variant=minbase`` rootfs of Debian's suite with its python3
  (3.11 in bookworm) linked into ``/usr/local/bin`` as the official image has it, imported
  with ``podman import``. The rootfs tarball is cached under ``$DDP_CACHE/images/`` by a key
  over the suite, the package list and :data:`SCRIPT_VERSION`.
- uv: a scratch image holding ``/uv`` and ``/uvx`` from PyPI's ``uv==<UV_VERSION>`` wheel.

A stand-in is rebuilt only when no image with its key label is in storage. The builds use
buildah's ``--layers`` cache, so a code change rebuilds only the layers that copy code. The
trainer image installs torch from PyPI (``TORCH_SOURCE=pypi``): the PyTorch index of the
shipped CPU variant is unreachable from here.

Containers run under runc, with the project's ``devcluster/containers.conf``
(``$CONTAINERS_CONF``): no default ulimits, which this sandbox cannot set. A CA bundle named
by the host's ``SSL_CERT_FILE`` (an intercepting egress proxy) is mounted for RUN steps only
(:func:`tls_flags`). docs/images.md has the measured build times.

For the node side: :func:`ensure_images` returns the refs, :func:`save_archive` writes one
as a tarball that ``ctr -n k8s.io images import`` accepts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from .containers import image_id, podman, podman_checked, podman_env, run_checked
from .paths import cache_dir

REPO = Path(__file__).resolve().parents[2]
# Bump when the way a stand-in is made changes: its key changes, so it is rebuilt.
SCRIPT_VERSION = "1"
SUITE = "bookworm"
# On top of minbase: what python:3.11-slim-bookworm has that the Dockerfiles rely on
# (python3.11; ca-certificates for TLS). passwd (useradd) is in minbase.
PACKAGES = ("python3", "ca-certificates", "netbase", "tzdata")
KEY_LABEL = "dev.ddp.stand-in-key"
PYTHON_BASE = "docker.io/library/python:3.11-slim-bookworm"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# The image config of the python stand-in: python:3.11-slim-bookworm's, plus SSL_CERT_FILE at
# Debian's own bundle, which makes uv (whose built-in roots ignore the system's) use the
# bundle that tls_flags() mounts there during a build.
PYTHON_CHANGES = (
    "ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    f"ENV SSL_CERT_FILE={CA_BUNDLE}",
    'CMD ["python3"]',
)
UV_BASE_REPO = "ghcr.io/astral-sh/uv"

Log = Callable[[str], None]


def _default_log(msg: str) -> None:
    print(f"[images] {msg}", file=sys.stderr, flush=True)


# ---- pure decisions ---------------------------------------------------------------------


@dataclass(frozen=True)
class ImageBuild:
    """One image of the repository and how it is built."""

    name: str  # "operator" | "trainer"
    ref: str
    dockerfile: Path
    build_args: tuple[tuple[str, str], ...] = ()


def dockerfile_arg(text: str, name: str) -> str:
    """The default of ``ARG name=...`` in a Dockerfile's text."""
    m = re.search(rf"^ARG {name}=(\S+)$", text, re.M)
    if not m:
        raise KeyError(f"no ARG {name}=... in the Dockerfile")
    return m.group(1)


def image_refs(values: Mapping[str, object], chart: Mapping[str, object]) -> dict[str, str]:
    """The refs the Helm chart runs by default: the operator's ``image.repository`` at the
    chart's appVersion (``image.tag`` when set), and ``trainerImage``. Built under these
    names, the images need no ``--set`` to be found by a node's containerd."""
    image = values["image"]
    assert isinstance(image, Mapping)
    tag = image.get("tag") or chart["appVersion"]
    return {"operator": f"{image['repository']}:{tag}", "trainer": str(values["trainerImage"])}


def builds(refs: Mapping[str, str], repo: Path = REPO) -> list[ImageBuild]:
    return [
        ImageBuild("operator", refs["operator"], repo / "Dockerfile"),
        ImageBuild(
            "trainer",
            refs["trainer"],
            repo / "trainer_image" / "Dockerfile",
            (("VARIANT", "cpu"), ("TORCH_SOURCE", "pypi")),
        ),
    ]


def debian_mirror(sources: Iterable[str], suite: str = SUITE) -> str:
    """The first ``deb`` URI of apt's sources (one-line or deb822 format) that serves
    ``suite`` itself (not ``suite-security``): the mirror this machine reaches."""
    for text in sources:
        for line in text.splitlines():  # one-line format
            parts = re.sub(r"\[[^\]]*\]", " ", line).split()  # without [options]
            if parts[:1] == ["deb"] and len(parts) >= 3 and parts[2] == suite:
                return parts[1].rstrip("/")
        for stanza in re.split(r"\n\s*\n", text):  # deb822
            fields: dict[str, str] = {}
            for ln in stanza.splitlines():
                k, sep, v = ln.partition(":")
                if sep and not ln.startswith(("#", " ", "\t")):
                    fields[k.strip().lower()] = v.strip()
            types, suites = fields.get("types", "").split(), fields.get("suites", "").split()
            if "deb" in types and suite in suites and fields.get("uris"):
                return fields["uris"].split()[0].rstrip("/")
    raise LookupError(f"no apt source serves {suite}")


def rootfs_key(suite: str = SUITE, packages: Iterable[str] = PACKAGES) -> str:
    """The content key of the python stand-in's rootfs tarball: what debootstrap is asked
    for, and how."""
    spec = {"suite": suite, "variant": "minbase", "packages": sorted(packages)}
    spec["script"] = SCRIPT_VERSION
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def python_key(rootfs: str, changes: Iterable[str] = PYTHON_CHANGES) -> str:
    """The key label of the python stand-in image: its rootfs and its config."""
    return hashlib.sha256(json.dumps([rootfs, *changes]).encode()).hexdigest()[:16]


def uv_key(uv_sha256: str) -> str:
    return hashlib.sha256(f"{SCRIPT_VERSION}:{uv_sha256}".encode()).hexdigest()[:16]


def step_progress(line: str) -> str | None:
    """``[2/3] STEP 5/14: RUN ...`` -> ``[2/3] 5/14 RUN ...`` (buildah's progress lines, the
    stage first in a multi-stage build), else None."""
    m = re.match(r"^(\[\d+/\d+\] )?STEP (\d+/\d+): (.{0,70})", line)
    return f"{m.group(1) or ''}{m.group(2)} {m.group(3)}" if m else None


def tls_flags(env: Mapping[str, str]) -> list[str]:
    """buildah flags that let the builds' downloads trust what this machine trusts: where
    ``SSL_CERT_FILE`` names a bundle (an intercepting egress proxy's CA added to it), that
    bundle is mounted over the image's during RUN steps only (the python stand-in points uv
    at that path, :data:`PYTHON_CHANGES`), so the images keep Debian's bundle. Nothing when
    the machine uses the public roots."""
    bundle = env.get("SSL_CERT_FILE")
    if not bundle or not Path(bundle).is_file():
        return []
    return ["--volume", f"{bundle}:{CA_BUNDLE}:ro"]


# ---- I/O ----------------------------------------------------------------------------------


def run_logged(argv: list[str], what: str, log: Log, every_s: float = 15.0) -> list[str]:
    """Runs a long command, logging each of buildah's STEP lines and, every ``every_s``
    seconds, the output so far and its rate (also through silent phases such as a layer
    commit); returns its output lines, whose tail goes into the error on failure."""
    t0 = last = time.monotonic()
    lines: list[str] = []
    step = ""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=podman_env()
    )
    out: queue.Queue[str | None] = queue.Queue()

    def reader() -> None:
        assert proc.stdout
        for line in proc.stdout:
            out.put(line.rstrip())
        out.put(None)

    threading.Thread(target=reader, daemon=True).start()
    while True:
        try:
            line = out.get(timeout=every_s)
        except queue.Empty:
            line = ""
        if line is None:
            break
        now = time.monotonic()
        if line:
            lines.append(line)
        if new_step := step_progress(line):
            step = new_step
            log(f"{what}: step {step} ({now - t0:.0f}s)")
            last = now
        elif now - last >= every_s:
            n = len(lines)
            log(f"{what}: {n} lines of output in {now - t0:.0f}s ({n / (now - t0):.1f}/s) {step}")
            last = now
    if proc.wait() != 0:
        raise RuntimeError(f"{what} failed ({proc.returncode}):\n" + "\n".join(lines[-60:]))
    log(f"{what}: done in {time.monotonic() - t0:.0f}s")
    return lines


def _label(ref: str, label: str) -> str | None:
    """A label of an image in local storage; None when the image is not there."""
    proc = podman("image", "inspect", "--format", f'{{{{index .Labels "{label}"}}}}', ref)
    return proc.stdout.strip() if proc.returncode == 0 else None


def _import(tarball: Path, ref: str, key: str, changes: list[str], log: Log) -> None:
    argv = ["podman", "import", "--change", f"LABEL {KEY_LABEL}={key}"]
    for c in changes:
        argv += ["--change", c]
    log(f"importing {tarball.name} ({tarball.stat().st_size / 2**20:.0f} MiB) as {ref}")
    run_checked([*argv, str(tarball), ref])


def _python_rootfs(tarball: Path, log: Log) -> None:
    """debootstrap the suite into a temporary directory and pack it into ``tarball``."""
    mirror = debian_mirror(
        p.read_text()
        for p in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
        if p.is_file() and p.suffix in (".list", ".sources")
    )
    debs = cache_dir() / "images" / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tarball.parent, prefix="rootfs-") as tmp:
        root = Path(tmp) / "root"
        run_logged(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(PACKAGES)}",
                f"--cache-dir={debs}",
                SUITE,
                str(root),
                mirror,
            ],
            f"debootstrap {SUITE} from {mirror}",
            log,
        )
        # As python:3.11-slim-bookworm: the interpreter under /usr/local/bin.
        local = root / "usr" / "local" / "bin"
        for name in ("python3.11", "python3", "python"):
            (local / name).unlink(missing_ok=True)
            (local / name).symlink_to("/usr/bin/python3.11")
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for p in (root / junk).glob("*"):
                if p.is_file():
                    p.unlink()
        for p in (root / "var" / "cache" / "apt").glob("*.bin"):
            p.unlink()
        partial = tarball.with_suffix(".partial")
        run_checked(["tar", "-C", str(root), "--numeric-owner", "-cf", str(partial), "."])
        partial.rename(tarball)


def ensure_python_base(log: Log = _default_log) -> str:
    rootfs = rootfs_key()
    key = python_key(rootfs)
    if _label(PYTHON_BASE, KEY_LABEL) == key:
        log(f"{PYTHON_BASE} (stand-in {key}) is in storage")
        return PYTHON_BASE
    tarball = cache_dir() / "images" / f"python-{SUITE}-{rootfs}.tar"
    tarball.parent.mkdir(parents=True, exist_ok=True)
    if not tarball.is_file():
        _python_rootfs(tarball, log)
    _import(tarball, PYTHON_BASE, key, list(PYTHON_CHANGES), log)
    return PYTHON_BASE


def _pip() -> Path:
    """A pip to download with: the one of the venv that holds the Makefile's uv, else a
    throwaway venv's (the dev environment is made by uv and has none)."""
    for venv in cache_dir().glob("uv-*"):
        if (venv / "bin" / "pip").is_file():
            return venv / "bin" / "pip"
    venv = cache_dir() / "images" / "pip-venv"
    if not (venv / "bin" / "pip").is_file():
        run_checked([sys.executable, "-m", "venv", str(venv)])
    return venv / "bin" / "pip"


def _uv_wheel(version: str, log: Log) -> Path:
    """PyPI's manylinux wheel of uv ``version``, downloaded once into the cache."""
    where = cache_dir() / "images" / f"uv-wheel-{version}"
    found = sorted(where.glob(f"uv-{version}-*.whl"))
    if found:
        return found[0]
    where.mkdir(parents=True, exist_ok=True)
    log(f"downloading uv=={version} from PyPI")
    run_checked(
        [str(_pip()), "download", "-q", "--no-deps", "--only-binary=:all:",
         "--platform", "manylinux_2_17_x86_64", "--python-version", "3.11",
         "-d", str(where), f"uv=={version}"]
    )  # fmt: skip
    return sorted(where.glob(f"uv-{version}-*.whl"))[0]


def ensure_uv_base(version: str, log: Log = _default_log) -> str:
    ref = f"{UV_BASE_REPO}:{version}"
    wheel = _uv_wheel(version, log)
    wheel_sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    key = uv_key(wheel_sha)
    if _label(ref, KEY_LABEL) == key:
        log(f"{ref} (stand-in {key}) is in storage")
        return ref
    with tempfile.TemporaryDirectory(dir=wheel.parent) as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        with zipfile.ZipFile(wheel) as z:
            for name in ("uv", "uvx"):
                member = f"uv-{version}.data/scripts/{name}"
                (root / name).write_bytes(z.read(member))
                (root / name).chmod(0o755)
        tarball = Path(tmp) / "uv.tar"
        run_checked(["tar", "-C", str(root), "--numeric-owner", "--owner=0", "--group=0",
              "-cf", str(tarball), "uv", "uvx"])  # fmt: skip
        _import(tarball, ref, key, ['ENTRYPOINT ["/uv"]'], log)
    return ref


def build_image(b: ImageBuild, log: Log = _default_log, context: Path = REPO) -> list[str]:
    """buildah build of one Dockerfile with the layer cache (the bases must be in storage);
    returns buildah's output lines."""
    # --format docker: what `docker build` writes (OCI's image config has no SHELL).
    # --force-rm: without it buildah 1.28 leaves the working container of the FROM-only `uv`
    # stage behind after every build.
    argv = ["buildah", "build", "--layers", "--force-rm", "--pull=never", "--runtime", "runc",
            "--format", "docker", "-f", str(b.dockerfile), "-t", b.ref]  # fmt: skip
    for k, v in b.build_args:
        argv += ["--build-arg", f"{k}={v}"]
    argv += tls_flags(os.environ)
    before = image_id(b.ref)
    lines = run_logged([*argv, str(context)], f"build {b.name} ({b.ref})", log)
    if before and before != image_id(b.ref):
        # The image the tag left, now dangling; kept where a later build step still uses it.
        podman("rmi", before)
    return lines


def default_refs() -> dict[str, str]:
    chart = REPO / "helm" / "ddp-operator"
    return image_refs(
        yaml.safe_load((chart / "values.yaml").read_text()),
        yaml.safe_load((chart / "Chart.yaml").read_text()),
    )


def ensure_bases(log: Log = _default_log) -> list[str]:
    uv_version = dockerfile_arg((REPO / "Dockerfile").read_text(), "UV_VERSION")
    return [ensure_python_base(log), ensure_uv_base(uv_version, log)]


def ensure_images(
    which: Iterable[str] = ("operator", "trainer"), log: Log = _default_log
) -> dict[str, str]:
    """Builds (or finds cached) the stand-in bases and the images; returns name -> ref,
    e.g. ``{"operator": "ghcr.io/ddp-operator/operator:0.1.0",
    "trainer": "ghcr.io/ddp-operator/trainer:0.1.0"}``."""
    wanted = set(which)
    ensure_bases(log)
    out = {}
    for b in builds(default_refs()):
        if b.name in wanted:
            build_image(b, log)
            out[b.name] = b.ref
    return out


def save_archive(ref: str, path: Path, fmt: str = "docker-archive") -> Path:
    """Writes image ``ref`` to ``path`` for ``ctr -n k8s.io images import PATH``.

    ``docker-archive`` (the default) names the image by its full ref in manifest.json's
    RepoTags, which ctr imports under that name; ``oci-archive`` is the alternative."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    podman_checked("save", "--format", fmt, "-o", str(path), ref)
    return path


def save_oci_archive(ref: str, path: Path) -> Path:
    return save_archive(ref, path, "oci-archive")


def sizes(refs: Iterable[str]) -> dict[str, int]:
    out = {}
    for ref in refs:
        out[ref] = int(podman_checked("image", "inspect", "--format", "{{.Size}}", ref).strip())
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ddp-devcluster images", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("which", nargs="*", help="operator, trainer (default: both)")
    ap.add_argument("--save-dir", type=Path, help="also write a docker-archive of each image")
    args = ap.parse_args(argv)
    if set(args.which) - {"operator", "trainer"}:
        ap.error(f"unknown image(s) {args.which}: operator, trainer")
    for tool in ("podman", "buildah", "debootstrap", "runc"):
        if shutil.which(tool) is None:
            print(f"{tool} is missing (make host-packages installs it)", file=sys.stderr)
            return 1
    t0 = time.monotonic()
    refs = ensure_images(args.which or ("operator", "trainer"))
    for name, ref in refs.items():
        size = sizes([ref])[ref]
        print(f"{name}: {ref} ({size / 1e6:.0f} MB)")
        if args.save_dir:
            print(f"  {save_archive(ref, args.save_dir / f'{name}.tar')}")
    print(f"in {time.monotonic() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
