"""The 4-node kind cluster (podman provider) on the cached node image: create or reuse it,
wait until every node and CoreDNS are Ready, and delete it with everything it left."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..build import binary
from ..containers import podman, podman_checked, podman_env
from ..images import REPO
from ..paths import cache_dir, state_dir
from ..polling import until
from . import registry
from .lock import held
from .nodeimage import PRELOAD_PATH, SHARED_PATH, ensure_node_image

if TYPE_CHECKING:
    from ..harness import Harness

NAME = "ddp"
CONFIG = REPO / "kind" / "cluster-4.yaml"
NETWORK = "kind"  # the podman network kind creates for its nodes
Log = Callable[[str], None]


def kind_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """kind's environment: podman as its provider, and the project's containers.conf for the
    podman it runs (without ``default_ulimits = []`` runc cannot start the nodes here)."""
    env = podman_env(base)
    env["KIND_EXPERIMENTAL_PROVIDER"] = "podman"
    return env


def kubeconfig_path(name: str = NAME) -> Path:
    return state_dir() / f"kind-{name}.kubeconfig"


def shared_dir(name: str = NAME) -> Path:
    """The host folder behind the ReadWriteMany class: mounted at SHARED_PATH in every node."""
    return state_dir() / f"kind-{name}-shared"


def requirements() -> str:
    """Why the kind cluster cannot start on this machine ("" when it can)."""
    if os.geteuid() != 0:
        return "not running as root (kind's nodes are privileged podman containers here)"
    gone = [c for c in ("podman", "buildah", "go", "gcc") if not shutil.which(c)]
    if gone:
        return f"{', '.join(gone)} missing (`make host-packages` installs podman and buildah)"
    for tool, name in (("kind", "kind"), ("registry", "registry"), ("kubernetes-node", "kubeadm")):
        try:
            binary(tool, name)
        except FileNotFoundError as e:
            return str(e)
    info = podman("info")
    if info.returncode != 0:
        return f"podman cannot run containers here: {info.stderr.strip()[-500:]}"
    return ""


def claim_folder(h: Harness, claim: str, *, ns: str | None = None, name: str = NAME) -> Path:
    """The host folder of a bound ``ddp-shared`` claim (every machine mounts that same
    folder): what a job wrote, readable whatever its pods are doing."""
    pvc = h.get("pvc", claim, ns=ns, check=True)
    pv = h.get("pv", pvc["spec"]["volumeName"], ns="", check=True)
    inside = Path(pv["spec"]["hostPath"]["path"])
    return shared_dir(name) / inside.relative_to(SHARED_PATH)


def node_count(config_text: str) -> int:
    import yaml

    return len(yaml.safe_load(config_text)["nodes"])


def rendered_config(config_text: str, shared: Path, preload: Path) -> str:
    """The cluster config kind is given: the one in kind/, with the shared folder and the node
    image's preload folder (read-only) mounted into every node (host paths, which a file in the
    repository cannot name)."""
    import yaml

    config = yaml.safe_load(config_text)
    mounts = [
        {"hostPath": str(shared), "containerPath": SHARED_PATH},
        {"hostPath": str(preload), "containerPath": PRELOAD_PATH, "readOnly": True},
    ]
    for node in config["nodes"]:
        node.setdefault("extraMounts", []).extend(mounts)
    return str(yaml.safe_dump(config, sort_keys=False))


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
    from ..plane import kubectl as run

    return run(kubeconfig, *args, check=check, input=input).stdout


def exists(name: str = NAME) -> bool:
    return name in _kind("get", "clusters").split()


def _inspect(name: str, field: str) -> str:
    return podman(
        "inspect", "--format", f"{{{{.{field}}}}}", f"{name}-control-plane"
    ).stdout.strip()


def _node_image(name: str) -> str:
    return _inspect(name, "ImageName")


def instance(name: str = NAME) -> str:
    """Which cluster of that name this is (its control plane's container id; "" when none):
    whoever finds it changed across :func:`up` made the cluster and deletes it after."""
    return _inspect(name, "Id")


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
    returns the kubeconfig once every node and CoreDNS are Ready. Waits while another process
    holds the cluster (:mod:`.lock`)."""
    with held(name, "making the cluster", log):
        return _up(log, name, config)


def _up(log: Log, name: str, config: Path) -> Path:
    Path("/lib/modules").mkdir(parents=True, exist_ok=True)  # kind mounts it; may be absent
    retired = cache_dir() / "node"  # the image store of the real node kind replaced (~10 GB)
    if retired.is_dir():
        shutil.rmtree(retired)
        log(f"removed {retired} (the retired real node's image store)")
    image, preload = ensure_node_image(log)
    registry.start()
    log(f"registry on {registry.HOST} (data in {registry.cache_dir() / 'registry'})")
    kubeconfig = kubeconfig_path(name)
    nodes = node_count(config.read_text())
    shared = shared_dir(name)
    wanted = rendered_config(config.read_text(), shared, preload)
    given = state_dir() / f"kind-{name}.yaml"  # the config the running cluster was made with
    if exists(name):
        # A cluster left by a run that was killed may have containers podman still calls
        # running while nothing runs in them: then there is no kubeconfig to read.
        found = _kind("get", "kubeconfig", "--name", name, check=False)
        kubeconfig.write_text(found)
        same = given.exists() and given.read_text() == wanted and _node_image(name) == image
        if found and same and _ready(kubeconfig, nodes):
            log(f"kind cluster {name!r} is up already")
            return kubeconfig
        why = "not every node is Ready" if same else "another config or node image"
        if not found:
            why = "its control plane does not answer"
        log(f"kind cluster {name!r} is there but cannot be used ({why}): recreating it")
        _kind("delete", "cluster", "--name", name)
    shared.mkdir(parents=True, exist_ok=True)
    given.parent.mkdir(parents=True, exist_ok=True)
    given.write_text(wanted)
    t0 = time.monotonic()
    log(f"creating kind cluster {name!r} ({nodes} nodes, {image})")
    kubeconfig.parent.mkdir(parents=True, exist_ok=True)
    _kind(
        "create", "cluster", "--name", name, "--image", image, "--config", str(given),
        "--kubeconfig", str(kubeconfig),
    )  # fmt: skip
    # Every machine takes training pods, the control plane too (kind taints it when there are
    # workers): four machines for up to four node pods, on two cores.
    kubectl(
        kubeconfig, "taint", "nodes", "-l", "node-role.kubernetes.io/control-plane",
        "node-role.kubernetes.io/control-plane:NoSchedule-", check=False,
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
    """Deletes the cluster, stops the registry and removes kind's podman network (once no
    other process holds the cluster)."""
    with held(name, "deleting the cluster", log):
        _down(log, name)


def _down(log: Log, name: str) -> None:
    if exists(name):
        t0 = time.monotonic()
        _kind("delete", "cluster", "--name", name)
        log(f"kind cluster {name!r} deleted in {time.monotonic() - t0:.0f}s")
    kubeconfig_path(name).unlink(missing_ok=True)
    (state_dir() / f"kind-{name}.yaml").unlink(missing_ok=True)
    shutil.rmtree(state_dir() / "kind-bin", ignore_errors=True)
    if shared_dir(name).exists():
        shutil.rmtree(shared_dir(name))
        log(f"shared volume folder {shared_dir(name)} removed")
    if registry.stop():
        log("registry stopped")
    # the network is shared by every kind cluster
    if not _kind("get", "clusters").split() and podman("network", "rm", NETWORK).returncode == 0:
        log(f"podman network {NETWORK!r} removed")


def export_logs(where: Path, name: str = NAME) -> None:
    """Each node's kubelet and containerd journals (``kind export logs`` needs crictl, which
    cannot be built here)."""
    where.mkdir(parents=True, exist_ok=True)
    for node in _kind("get", "nodes", "--name", name, check=False).split():
        for unit in ("kubelet", "containerd"):
            proc = podman("exec", node, "journalctl", "--no-pager", "-u", unit, "-n", "3000")
            (where / f"{node}-{unit}.log").write_text(proc.stdout + proc.stderr)


# --- pulling an image onto every machine ------------------------------------------------------

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def go_duration_s(text: str) -> float:
    """A Go duration as kubelet prints it (``41.2s``, ``1m2.5s``, ``812ms``) in seconds."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a Go duration: {text!r}")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def pulled_s(message: str) -> float | None:
    """How long a pull took, from kubelet's ``Pulled`` event; None when nothing was pulled
    (``Container image ... already present on machine``)."""
    m = re.match(r'Successfully pulled image "[^"]+" in (\S+) ', message)
    return go_duration_s(m.group(1)) if m else None


def _pull_pod(node: str, ref: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"pull-{node}", "labels": {"app": "ddp-pull"}},
        "spec": {
            "nodeName": node,  # every machine, the control plane too: no scheduler involved
            "restartPolicy": "Never",
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "pull", "image": ref, "imagePullPolicy": "IfNotPresent",
                            "command": ["true"]}],
        },
    }  # fmt: skip


def pull_everywhere(kubeconfig: Path, ref: str, log: Log = print) -> dict[str, float | None]:
    """Pulls ``ref`` onto every node at once (one pod per node that runs ``true``); returns
    each node's pull time from kubelet's event (None: the image was there already)."""
    ns = "ddp-pull"

    def gone_or_active() -> bool:  # the last call's namespace may still be terminating
        phase = kubectl(kubeconfig, "get", "namespace", ns, "-o", "jsonpath={.status.phase}",
                        "--ignore-not-found")  # fmt: skip
        return phase.strip() != "Terminating"

    until(f"namespace {ns} not terminating", gone_or_active, timeout_s=300, interval_s=1)
    kubectl(kubeconfig, "create", "namespace", ns, check=False)
    nodes = json.loads(kubectl(kubeconfig, "get", "nodes", "-o", "json"))["items"]
    names = [n["metadata"]["name"] for n in nodes]
    kubectl(kubeconfig, "-n", ns, "delete", "pods", "-l", "app=ddp-pull", "--wait=true")
    listing = {"apiVersion": "v1", "kind": "List", "items": [_pull_pod(n, ref) for n in names]}
    t0 = time.monotonic()
    kubectl(kubeconfig, "-n", ns, "apply", "-f", "-", input=json.dumps(listing))

    def done() -> bool:
        pods = json.loads(kubectl(kubeconfig, "-n", ns, "get", "pods", "-o", "json"))["items"]
        phases = [p.get("status", {}).get("phase") for p in pods]
        failed = [p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Failed"]
        if failed:
            raise RuntimeError(f"pulling {ref} failed on {failed}")
        log(f"pulling {ref}: {phases.count('Succeeded')}/{len(names)} nodes done"
            f" ({time.monotonic() - t0:.0f}s)")  # fmt: skip
        return phases.count("Succeeded") == len(names)

    until(f"{ref} on every node", done, timeout_s=900, interval_s=5)
    events = json.loads(
        kubectl(kubeconfig, "-n", ns, "get", "events", "--field-selector", "reason=Pulled",
                "-o", "json")
    )["items"]  # fmt: skip
    out: dict[str, float | None] = dict.fromkeys(names)
    for e in events:
        node = e["involvedObject"]["name"].removeprefix("pull-")
        if node in out:
            out[node] = pulled_s(e.get("message", ""))
    kubectl(kubeconfig, "delete", "namespace", ns, "--wait=false")
    return out


def publish(kubeconfig: Path, log: Log = print) -> dict[str, str]:
    """Both images (built by `make images` when missing) pushed to the host registry and the
    trainer's pulled onto every machine; returns the refs the cluster runs, by image name."""
    from .. import images

    refs = images.ensure_images(log=log)
    remote = {name: registry.push(ref, log) for name, ref in refs.items()}
    t0 = time.monotonic()
    pulled = pull_everywhere(kubeconfig, remote["trainer"], log)
    took = ", ".join(f"{n} {'present' if s is None else f'{s:.1f}s'}" for n, s in pulled.items())
    log(f"trainer image on every machine in {time.monotonic() - t0:.0f}s ({took})")
    return remote


def install(kubeconfig: Path, log: Log = print) -> dict[str, str]:
    """The images published (:func:`publish`) and the chart installed (or upgraded) with them;
    returns the refs the cluster runs, by image name."""
    from ..chart import install_chart

    remote = publish(kubeconfig, log)
    # Helm installs a chart's crds/ only once and never upgrades them: this checkout's CRD is
    # applied first, so that a cluster kept across changes validates the current API.
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f",
            str(REPO / "helm" / "ddp-operator" / "crds"))  # fmt: skip
    install_chart(kubeconfig, remote["operator"], remote["trainer"], "IfNotPresent")
    log(f"chart installed: operator {remote['operator']}, trainer {remote['trainer']}")
    return remote


def host_address() -> str:
    """This machine's address on kind's podman network: where a node, and the API server on
    the control plane, reach a server of this machine (a webhook)."""
    out = podman("network", "inspect", NETWORK, check=True)
    return ipv4_gateway(json.loads(out.stdout)[0])


def ipv4_gateway(network: Mapping[str, Any]) -> str:
    """The IPv4 gateway of a ``podman network inspect`` entry (kind's network is dual-stack, its
    IPv6 subnet first; the nodes' InternalIPs are IPv4)."""
    for subnet in network.get("subnets") or []:
        if ":" not in subnet.get("gateway", ":"):
            return str(subnet["gateway"])
    raise RuntimeError(f"podman network {network.get('name')!r} has no IPv4 gateway")


def pod_routes(nodes: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(pod CIDR, node IP) of each node of a ``kubectl get nodes -o json`` list that has both:
    the routes by which this machine reaches the pods (kind's nodes route among themselves)."""
    routes = []
    for n in nodes.get("items", []):
        cidr = n.get("spec", {}).get("podCIDR")
        ips = [a["address"] for a in n.get("status", {}).get("addresses", [])
               if a["type"] == "InternalIP"]  # fmt: skip
        if cidr and ips:
            routes.append((cidr, ips[0]))
    return routes


def route_to_pods(kubeconfig: Path) -> list[tuple[str, str]]:
    """Routes this machine to every node's pods (``ip route replace``; root), as a machine of
    a cluster's network is, so that a process here scrapes a pod by its IP. They go with
    kind's network when the last cluster is deleted."""
    routes = pod_routes(json.loads(kubectl(kubeconfig, "get", "nodes", "-o", "json")))
    for cidr, via in routes:
        subprocess.run(["ip", "route", "replace", cidr, "via", via], check=True,
                       capture_output=True)  # fmt: skip
    return routes


def user_tools() -> Path:
    """A folder for the user's PATH with ``kubectl`` (the pinned one) and ``kubectl-ddp`` (this
    checkout's client, run by the project's Python), so that ``kubectl ddp`` works at once."""
    import sys

    from ..plane import kubectl_path

    tools = state_dir() / "kind-bin"
    tools.mkdir(parents=True, exist_ok=True)
    kubectl_link = tools / "kubectl"
    kubectl_link.unlink(missing_ok=True)
    kubectl_link.symlink_to(kubectl_path())
    plugin = tools / "kubectl-ddp"
    plugin.write_text(
        "#!/bin/sh\n# kubectl ddp from this checkout (written by `make up`)\n"
        f'PYTHONPATH="{REPO / "api"}:{REPO / "client"}${{PYTHONPATH:+:$PYTHONPATH}}" '
        f'exec "{sys.executable}" -m ddp_client.cli "$@"\n'
    )
    plugin.chmod(0o755)
    return tools


# --- losing a machine -------------------------------------------------------------------------


FREEZE_TRIES = 5


def freeze(node: str) -> None:
    """The machine stops answering, as after a kernel hang or a network partition: every
    process of its container (kubelet, containerd, the pods) is frozen (cgroup freezer), so
    nothing is said to anyone: no TCP reset, no status, no heartbeat."""
    if node.endswith("-control-plane"):
        raise ValueError("freezing the control plane would freeze the API server")
    # The cgroup v1 freezer can fail to settle while a task of the container is busy in the
    # kernel; runc then gives up ("unable to freeze") and thaws it again: try again, briefly.
    for attempt in range(FREEZE_TRIES):
        try:
            podman_checked("pause", node)
            return
        except RuntimeError as e:
            if "unable to freeze" not in str(e) or attempt == FREEZE_TRIES - 1:
                raise
            time.sleep(1.0)


def thaw(node: str, kubeconfig: Path | None = None, timeout_s: float = 300) -> None:
    """The machine comes back: its kubelet finds its pods deleted and removes them. With
    ``kubeconfig``, returns once the node reports Ready again: until then the taint manager
    goes on evicting its pods (after their tolerations), whatever the next step is."""
    podman_checked("unpause", node)
    if kubeconfig is not None:
        wait_ready(kubeconfig, node, timeout_s)


def power_off(node: str) -> None:
    """The machine loses its power: its container is stopped with no grace (``podman stop
    --time 0``: no shutdown runs on it, its kubelet says nothing, its pods' connections go
    unanswered)."""
    if node.endswith("-control-plane"):
        raise ValueError("powering off the control plane would stop the API server")
    podman_checked("stop", "--time", "0", node)


def power_on(kubeconfig: Path, node: str, timeout_s: float = 300) -> None:
    """The machine starts again and its kubelet reports Ready. kind does not promise that a
    node restarted under podman comes back (kubernetes-sigs/kind#2272: its address may
    change); when it does not, the next :func:`up` finds a node not Ready and makes the
    cluster again."""
    podman_checked("start", node)
    wait_ready(kubeconfig, node, timeout_s)


# How recent a machine's last heartbeat (its kubelet's Lease renewal, every 10 s) must be for
# it to count as heard: under the operator's 12 s silence bound, so the operator hears it too.
HEARD_WITHIN_S = 10.0


def wait_ready(kubeconfig: Path, node: str, timeout_s: float = 300) -> None:
    """Returns once ``node`` reports Ready, carries none of the taints that the node lifecycle
    controller puts on a machine it does not hear from, and its kubelet has renewed its Lease
    in the last :data:`HEARD_WITHIN_S` seconds. A Node says Ready before its restarted kubelet
    renews: the operator, which watches the Leases, then still takes the machine for silent
    and keeps new pods off it (seen in CI: a job started then had two of its three groups put
    on one machine)."""

    def back() -> bool:
        obj = json.loads(kubectl(kubeconfig, "get", "node", node, "-o", "json"))
        if not is_ready(obj) or lost_taints(obj):
            return False
        lease = json.loads(
            kubectl(kubeconfig, "get", "lease", node, "-n", "kube-node-lease", "-o", "json")
        )
        return heard_within(lease, time.time(), HEARD_WITHIN_S)

    until(f"{node} Ready and heard again", back, timeout_s=timeout_s, interval_s=2)


def heard_within(lease: Mapping[str, Any], now: float, within_s: float) -> bool:
    """Whether a node's Lease (as ``kubectl get -o json`` shows it) was renewed in the last
    ``within_s`` seconds before ``now`` (Unix time; kind's machines share this host's clock)."""
    renewed = (lease.get("spec") or {}).get("renewTime")
    if not renewed:
        return False
    at = datetime.fromisoformat(renewed.replace("Z", "+00:00")).timestamp()
    return now - at <= within_s


LOST_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def lost_taints(node: Mapping[str, Any]) -> list[str]:
    """The not-ready/unreachable taints on a node (as ``kubectl get -o json`` shows it)."""
    return [t["key"] for t in node.get("spec", {}).get("taints") or [] if t["key"] in LOST_TAINTS]
