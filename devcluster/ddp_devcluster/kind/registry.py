"""The image registry on the host (CNCF distribution) that the kind nodes pull from: one
background process, recorded in the run folder for ``stop`` to find."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from ..build import binary
from ..paths import cache_dir, state_dir
from ..polling import until

PORT = 5001  # pods name images localhost:5001/...; the nodes map it to the host (hosts.toml)
HOST = f"localhost:{PORT}"
# The same registry under another name, for pushes only. buildah (1.28) always compresses what
# it sends to a registry, and reuses a blob that it once pushed to the same host in another
# compression (its blob-info cache is keyed by host): pushes under HOST kept reusing the gzip
# layers of an early push. Under this name every layer went out as zstd, which the nodes'
# containerd unpacks several times faster than gzip (bench/kind_image_pull.py).
PUSH_HOST = f"127.0.0.1:{PORT}"
Log = Callable[[str], None]


def remote_ref(local_ref: str, image_id: str) -> str:
    """Where an image built here lives in the registry: its repository under HOST, its tag
    plus the first 12 characters of its image ID, so that a rebuilt image gets a new tag (pods
    with ``IfNotPresent`` pull it) and an unchanged one keeps its tag (nothing is pulled).

    ``ghcr.io/ddp-operator/trainer:0.1.0`` -> ``localhost:5001/ddp-operator/trainer:0.1.0-1a2b..``
    """
    name, tag = local_ref.rsplit(":", 1)
    path = name.split("/", 1)[1] if "." in name.split("/", 1)[0] else name
    digest = image_id.removeprefix("sha256:")[:12]
    return f"{HOST}/{path}:{tag}-{digest}"


def config(data_dir: Path, port: int = PORT) -> str:
    """The registry's config.yml: filesystem storage, plain HTTP on every address (the kind
    nodes reach it through podman's network gateway)."""
    return (
        "version: 0.1\n"
        "log:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {data_dir}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: 0.0.0.0:{port}\n"
    )


def _record() -> Path:
    return state_dir() / "kind-registry.json"


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _answers() -> bool:
    try:
        with urllib.request.urlopen(f"http://{HOST}/v2/", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def running() -> int | None:
    """The pid of the registry that ``start`` left running, if it still runs."""
    if not _record().exists():
        return None
    pid = int(json.loads(_record().read_text())["pid"])
    return pid if _alive(pid) else None


def start() -> int:
    """Starts the registry unless it runs already; returns its pid once it answers."""
    pid = running()
    if pid is None:
        root = cache_dir() / "registry"
        (root / "data").mkdir(parents=True, exist_ok=True)
        (root / "config.yml").write_text(config(root / "data"))
        state_dir().mkdir(parents=True, exist_ok=True)
        log = (state_dir() / "kind-registry.log").open("ab")
        proc = subprocess.Popen(
            [str(binary("registry", "registry")), "serve", str(root / "config.yml")],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # outlives kind-up; kind-down stops it
        )
        pid = proc.pid
        _record().write_text(json.dumps({"pid": pid, "port": PORT}))
    until(f"the registry on {HOST}", _answers, timeout_s=30)
    return pid


def push(local_ref: str, log: Log = print) -> str:
    """Pushes an image of podman's storage to the registry (zstd layers, sent to PUSH_HOST: the
    nodes' containerd decompresses zstd far faster than gzip, on this machine's two cores);
    returns the ref pods use (under HOST: the same registry, repository and tag).

    Layers the registry holds already are not sent again, so after a code change only the
    code layer moves, and an image pushed before is a no-op of about a second."""
    from ..containers import image_id
    from ..images import run_logged

    local_id = image_id(local_ref)
    if local_id is None:
        raise FileNotFoundError(f"{local_ref} is not in podman's storage: run `make images`")
    ref = remote_ref(local_ref, local_id)
    t0 = time.monotonic()
    run_logged(
        ["buildah", "push", "--tls-verify=false", "--compression-format", "zstd", "--retry", "2",
         local_ref, f"docker://{PUSH_HOST}{ref.removeprefix(HOST)}"],
        f"push {ref}",
        log,
    )  # fmt: skip
    log(f"{ref} in the registry ({time.monotonic() - t0:.1f}s)")
    return ref


def stop() -> bool:
    """Stops the registry that ``start`` started; False if none was running."""
    pid = running()
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    _record().unlink(missing_ok=True)
    return pid is not None
