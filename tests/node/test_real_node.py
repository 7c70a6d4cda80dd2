"""The real node (ddp_devcluster.node): real containers, networking, DNS, volumes, and nothing
left behind, even when the process that started it is killed with SIGKILL."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddp_devcluster.node import RealNode, cleanup, requirements
from ddp_devcluster.paths import source_path
from ddp_devcluster.plane import MARKER_ENV, ControlPlane, kubectl_path, processes_with_marker
from ddp_devcluster.polling import until
from ddp_devcluster.pytest_plugin import unavailable

REPO = Path(__file__).resolve().parents[2]


def _require_node() -> str:
    why = requirements()
    if why:
        unavailable(f"the real node cannot start here: {why}")
    from ddp_devcluster import images

    return images.ensure_python_base()


@pytest.fixture(scope="module")
def node() -> Iterator[tuple[ControlPlane, RealNode]]:
    helper = _require_node()
    n = RealNode(helper_image=helper, log=lambda m: print(f"\n[node] {m}"))
    lay = n.prepare()
    plane = ControlPlane(nodes=0, advertise_address=lay.host_ip)
    try:
        plane.start()
        n.start(plane)
        yield plane, n
    finally:
        n.stop()
        plane.stop()


def _run_pod(plane: ControlPlane, manifest: str, name: str) -> str:
    plane.kubectl("apply", "-f", "-", input=manifest)
    until(
        f"pod {name} finished",
        lambda: (
            plane.kubectl(
                "get", "pod", name, "-o", "jsonpath={.status.phase}", check=False
            ).stdout.strip()
            in ("Succeeded", "Failed")
        ),
        120,
        0.5,
        detail=lambda: plane.kubectl("describe", "pod", name, check=False).stdout[-3000:],
    )
    return plane.kubectl("logs", name).stdout


def test_pods_get_dns_services_the_api_and_a_provisioned_volume(
    node: tuple[ControlPlane, RealNode],
) -> None:
    plane, n = node
    image = n.helper_image
    # A server behind a headless Service (a pod name in DNS) and a ClusterIP Service.
    plane.kubectl(
        "apply",
        "-f",
        "-",
        input=f"""
apiVersion: v1
kind: Service
metadata: {{name: hl}}
spec: {{clusterIP: None, selector: {{app: web}}, publishNotReadyAddresses: true}}
---
apiVersion: v1
kind: Service
metadata: {{name: web}}
spec: {{selector: {{app: web}}, ports: [{{port: 80, targetPort: 8000}}]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: web, labels: {{app: web}}}}
spec:
  hostname: web-0
  subdomain: hl
  containers:
  - name: web
    image: {image}
    imagePullPolicy: Never
    command: [python3, -m, http.server, "8000"]
    readinessProbe: {{httpGet: {{path: /, port: 8000}}, periodSeconds: 1}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: data}}
spec: {{accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 1Gi}}}}}}
""",
    )
    plane.kubectl("wait", "pod/web", "--for=condition=Ready", "--timeout=120s")
    probe = r"""
import json, os, socket, urllib.request
out = {"uid": os.getuid()}
for name in ("kubernetes.default.svc.cluster.local", "web.default.svc.cluster.local",
             "web-0.hl.default.svc.cluster.local"):
    out[name] = socket.gethostbyname(name)
out["service"] = urllib.request.urlopen("http://web/", timeout=10).status
out["headless"] = urllib.request.urlopen("http://web-0.hl:8000/", timeout=10).status
socket.create_connection(("kubernetes.default", 443), timeout=10).close()
out["api"] = "reachable"
with open("/data/written", "w") as f:
    f.write("kept")
print(json.dumps(out))
"""
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "client"},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "runAsGroup": 1000,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "client",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", probe],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            ],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
        },
    }
    logs = _run_pod(plane, json.dumps(manifest), "client")
    result = json.loads(logs.strip().splitlines()[-1])
    web_ip = plane.kubectl("get", "pod", "web", "-o", "jsonpath={.status.podIP}").stdout
    web_svc = plane.kubectl("get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}").stdout
    assert result == {
        "uid": 1000,
        "kubernetes.default.svc.cluster.local": "10.96.0.1",
        "web.default.svc.cluster.local": web_svc,
        "web-0.hl.default.svc.cluster.local": web_ip,
        "service": 200,
        "headless": 200,
        "api": "reachable",
    }
    # The claim was bound by the provisioner to a folder on the node, which now holds the file.
    pv = plane.kubectl("get", "pvc", "data", "-o", "jsonpath={.spec.volumeName}").stdout
    path = plane.kubectl(
        "get", "pv", pv, "-o", "jsonpath={.spec.hostPath.path}{.spec.local.path}"
    ).stdout
    assert path.startswith(str(n.layout.path("volumes"))), path
    assert (Path(path) / "written").read_text() == "kept"
    # The host reaches pods through the node (how tests scrape their metrics).
    import urllib.request

    with urllib.request.urlopen(f"http://{web_ip}:8000/", timeout=10) as r:
        assert r.status == 200
    # `kubectl logs` and `exec` go through the API server to this kubelet, over TLS.
    assert "GET / HTTP" in plane.kubectl("logs", "web").stdout
    assert plane.kubectl("exec", "web", "--", "id", "-u").stdout.strip() == "0"


def _leftovers(x: int, marker: str) -> dict[str, object]:
    """Everything of node ``x`` still on the machine: should be empty."""
    found: dict[str, object] = {}
    pids = processes_with_marker(marker)
    if pids:
        found["processes"] = pids
    cgroups = [str(p) for p in cleanup.cgroup_dirs(f"/ddp-node-{x}")]
    if cgroups:
        found["cgroups"] = cgroups
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    if f"ddpn-{x}" in netns:
        found["netns"] = netns
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    if re.search(rf"\bddpn{x}\b", links):
        found["link"] = f"ddpn{x}"
    mounts = [
        line
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if f"/var/lib/ddp-node/{x}" in line
    ]
    if mounts:
        found["mounts"] = mounts
    rules = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout
    if f"10.{x}." in rules:
        found["iptables"] = [r for r in rules.splitlines() if f"10.{x}." in r]
    if Path(f"/var/lib/ddp-node/{x}").exists():
        found["state"] = f"/var/lib/ddp-node/{x}"
    shims = [
        p.parent.name
        for p in Path("/proc").glob("[0-9]*/cmdline")
        if f"/var/lib/ddp-node/{x}/".encode() in (p.read_bytes() if p.exists() else b"")
    ]
    if shims:
        found["processes naming the state folder"] = shims
    return found


def test_nothing_is_left_after_the_owner_is_killed_with_sigkill(tmp_path: Path) -> None:
    helper = _require_node()
    marker = uuid.uuid4().hex
    env = {
        **os.environ,
        MARKER_ENV: marker,
        "PYTHONPATH": source_path(),
    }
    log = tmp_path / "node.log"
    with log.open("w") as out:
        owner = subprocess.Popen(
            [sys.executable, "-m", "ddp_devcluster.node", "--helper-image", helper],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        kubeconfig = until(
            "the node up",
            lambda: re.search(r"KUBECONFIG=(\S+)", log.read_text()),
            120,
            0.5,
            detail=log.read_text,
        ).group(1)
        x = int(re.search(r"at 10\.(\d+)\.255\.2", log.read_text()).group(1))  # type: ignore[union-attr]
        k = [kubectl_path(), f"--kubeconfig={kubeconfig}"]
        sleeper = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "sleeper"},
            "spec": {
                "containers": [
                    {
                        "name": "s",
                        "image": helper,
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", "sleep 1000 & sleep 1000"],
                    }
                ]
            },
        }
        subprocess.run([*k, "apply", "-f", "-"], input=json.dumps(sleeper), text=True, check=True)
        subprocess.run(
            [*k, "wait", "pod/sleeper", "--for=condition=Ready", "--timeout=120s"], check=True
        )
        assert cleanup.cgroup_pids(f"/ddp-node-{x}"), "the pod's processes are in no cgroup"
    finally:
        os.killpg(owner.pid, signal.SIGKILL)
        owner.wait()
    t0 = time.monotonic()
    until(
        "the watchdog's cleanup",
        lambda: not _leftovers(x, marker),
        60,
        0.5,
        detail=lambda: json.dumps(_leftovers(x, marker), indent=1),
    )
    print(f"cleaned up {time.monotonic() - t0:.1f}s after SIGKILL")
