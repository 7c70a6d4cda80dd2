"""The 4-node kind cluster (podman provider) on the cached node image: create or reuse it,
wait until every node and CoreDNS are Ready, and delete it with everything it left."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..build import binary
from ..images import CONTAINERS_CONF, REPO
from ..paths import state_dir
from ..polling import until
from . import registry
from .nodeimage import ensure_node_image

NAME = "ddp"
CONFIG = REPO / "kind" / "cluster-4.yaml"
NETWORK = "kind"  # the podman network kind creates for its nodes
Log = Callable[[str], None]


def kind_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """kind's environment: podman as its provider, and the project's containers.conf for the
    podman it runs (without ``default_ulimits = []`` runc cannot start the nodes here)."""
    env = dict(os.environ if base is None else base)
    env["KIND_EXPERIMENTAL_PROVIDER"] = "podman"
    env.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))
    return env


def kubeconfig_path(name: str = NAME) -> Path:
    return state_dir() / f"kind-{name}.kubeconfig"


def node_count(config_text: str) -> int:
    import yaml

    return len(yaml.safe_load(config_text)["nodes"])


def is_ready(obj: Mapping[str, Any]) -> bool:
    """Whether a node or a pod (as ``kubectl get -o json`` shows it) has condition Ready."""
    conditions = obj.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def ready_names(listing: Mapping[str, Any]) -> list[str]:
    """The names of the Ready items of a ``kubectl get ... -o json`` list."""
    return [o["metadata"]["name"] for o in listing.get("items", []) if is_ready(o)]


def _kind(*args: str, check: bool = True, timeout: float = 600) -> str:
    proc = subprocess.run(
        [str(binary("kind", "kind")), *args],
        env=kind_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"kind {' '.join(args)} failed:\n{proc.stderr[-4000:]}")
    return proc.stdout


def kubectl(kubeconfig: Path, *args: str, check: bool = True, input: str | None = None) -> str:
    from ..plane import kubectl_path

    proc = subprocess.run(
        [kubectl_path(), f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        input=input,
        timeout=120,
        check=False,
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed:\n{proc.stderr[-4000:]}")
    return proc.stdout


def exists(name: str = NAME) -> bool:
    return name in _kind("get", "clusters").split()


def _node_image(name: str) -> str:
    out = subprocess.run(
        ["podman", "inspect", "--format", "{{.ImageName}}", f"{name}-control-plane"],
        env=kind_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip()


def _ready(kubeconfig: Path, nodes: int) -> bool:
    out = kubectl(kubeconfig, "get", "nodes", "-o", "json", check=False)
    if not out or len(ready_names(json.loads(out))) != nodes:
        return False
    dns = kubectl(
        kubeconfig, "-n", "kube-system", "get", "pods", "-l", "k8s-app=kube-dns", "-o", "json",
        check=False,
    )  # fmt: skip
    pods = json.loads(dns or "{}").get("items", [])
    return bool(pods) and all(is_ready(p) for p in pods)


def up(log: Log = print, name: str = NAME, config: Path = CONFIG) -> Path:
    """Starts the registry and the cluster (reusing a healthy one on the same node image);
    returns the kubeconfig once every node and CoreDNS are Ready."""
    Path("/lib/modules").mkdir(parents=True, exist_ok=True)  # kind mounts it; may be absent
    image = ensure_node_image(log)
    registry.start()
    log(f"registry on {registry.HOST} (data in {registry.cache_dir() / 'registry'})")
    kubeconfig = kubeconfig_path(name)
    nodes = node_count(config.read_text())
    if exists(name):
        kubeconfig.write_text(_kind("get", "kubeconfig", "--name", name))
        if _node_image(name) == image and _ready(kubeconfig, nodes):
            log(f"kind cluster {name!r} is up already")
            return kubeconfig
        log(f"kind cluster {name!r} is unhealthy or on another node image: recreating it")
        _kind("delete", "cluster", "--name", name)
    t0 = time.monotonic()
    log(f"creating kind cluster {name!r} ({nodes} nodes, {image})")
    kubeconfig.parent.mkdir(parents=True, exist_ok=True)
    _kind(
        "create", "cluster", "--name", name, "--image", image, "--config", str(config),
        "--kubeconfig", str(kubeconfig),
    )  # fmt: skip
    until(
        f"{nodes} Ready nodes and CoreDNS",
        lambda: _ready(kubeconfig, nodes),
        timeout_s=180,
        interval_s=1,
        detail=lambda: kubectl(kubeconfig, "get", "nodes,pods", "-A", "-o", "wide", check=False),
    )
    log(f"kind cluster {name!r} ready in {time.monotonic() - t0:.0f}s")
    return kubeconfig


def down(log: Log = print, name: str = NAME) -> None:
    """Deletes the cluster, stops the registry and removes kind's podman network."""
    if exists(name):
        t0 = time.monotonic()
        _kind("delete", "cluster", "--name", name)
        log(f"kind cluster {name!r} deleted in {time.monotonic() - t0:.0f}s")
    kubeconfig_path(name).unlink(missing_ok=True)
    if registry.stop():
        log("registry stopped")
    if not _kind("get", "clusters").split():  # the network is shared by every kind cluster
        proc = subprocess.run(
            ["podman", "network", "rm", NETWORK],
            env=kind_env(),
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode == 0:
            log(f"podman network {NETWORK!r} removed")
