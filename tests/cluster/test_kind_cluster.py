"""The 4-node kind cluster of `make up`: its nodes, its pod network and Services across nodes,
pulls from the host registry, local-path volumes (one machine's) and the shared class's
(every machine's)."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ddp_devcluster.kind import registry
from ddp_devcluster.kind.cluster import is_ready
from ddp_devcluster.kind.nodeimage import SHARED_CLASS, helper_image, helper_rootfs
from ddp_devcluster.versions import CONTAINERD, KUBERNETES
from kind_env import KindCluster

NODES = ["ddp-control-plane", "ddp-worker", "ddp-worker2", "ddp-worker3"]
TOLERATE_ALL = [{"operator": "Exists"}]


@pytest.fixture(scope="module")
def ns(kind_cluster: KindCluster) -> Iterator[str]:
    name = f"kind-{uuid.uuid4().hex[:6]}"
    kind_cluster.k("create", "namespace", name)
    yield name
    kind_cluster.k("delete", "namespace", name, "--wait=false", check=False)


def pod(name: str, ns: str, node: str | None, image: str, script: str, **spec: Any) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {
            **({"nodeName": node} if node else {}),
            "tolerations": TOLERATE_ALL,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": "c", "image": image, "command": ["/bin/sh", "-c", script], **spec}
            ],
        },
    }


def claim_of(name: str, ns: str, mode: str, storage_class: str) -> dict:
    """A 16Mi PersistentVolumeClaim of one access mode on one class."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "accessModes": [mode],
            "storageClassName": storage_class,
            "resources": {"requests": {"storage": "16Mi"}},
        },
    }


def test_every_node_is_ready_on_the_pinned_versions(kind_cluster: KindCluster) -> None:
    nodes = kind_cluster.get("nodes")["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == NODES
    for n in nodes:
        assert is_ready(n), n["metadata"]["name"]
        info = n["status"]["nodeInfo"]
        assert info["kubeletVersion"] == f"v{KUBERNETES}"
        assert info["containerRuntimeVersion"] == f"containerd://{CONTAINERD}"


def test_pods_on_every_node_reach_each_other_by_ip_and_by_service_name(
    kind_cluster: KindCluster, ns: str
) -> None:
    """A web server on each node, fetched from a pod on the next node."""
    image = helper_image()  # on every node already: imagePullPolicy Never
    serve = "mkdir /www && echo $NODE > /www/index.html && exec httpd -f -p 8080 -h /www"
    objs: list[dict] = []
    for i, node in enumerate(NODES):
        web = pod(
            f"web-{i}",
            ns,
            node,
            image,
            serve,
            imagePullPolicy="Never",
            env=[{"name": "NODE", "value": node}],
            ports=[{"containerPort": 8080}],
        )
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": f"web-{i}", "namespace": ns},
            "spec": {"selector": {"app": f"web-{i}"}, "ports": [{"port": 80, "targetPort": 8080}]},
        }
        objs += [web, service]
    kind_cluster.apply(*objs)

    def all_ready() -> dict[str, str] | None:
        pods = kind_cluster.get("pods", "-n", ns, "-l", "app in (web-0,web-1,web-2,web-3)")
        ready = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods["items"] if is_ready(p)}
        return ready if len(ready) == len(NODES) else None

    ips = kind_cluster.until("a ready web pod on each node", all_ready, ns=ns)
    for i, node in enumerate(NODES):
        client = f"web-{(i + 1) % len(NODES)}"
        for host, port in ((ips[f"web-{i}"], 8080), (f"web-{i}.{ns}.svc.cluster.local", 80)):
            got = kind_cluster.until(
                f"{client} fetching http://{host}:{port}/",
                lambda host=host, port=port, client=client: http_get(
                    kind_cluster, ns, client, host, port
                ),
                timeout_s=60,
                ns=ns,
            )
            assert got == node, f"{client} -> {host}:{port}"


def http_get(kind_cluster: KindCluster, ns: str, pod: str, host: str, port: int) -> str | None:
    """The body of a 200 answer to GET / from inside ``pod``, else None. busybox nc, not wget:
    Debian's static busybox wget segfaults here (exit 139), even on an IP address."""
    request = f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {host} {port}"
    out = kind_cluster.k("exec", "-n", ns, pod, "--", "/bin/sh", "-c", request, check=False)
    head, _, body = out.replace("\r\n", "\n").partition("\n\n")
    return body.strip() if head.startswith("HTTP/1.") and " 200 " in head.split("\n")[0] else None


def test_an_image_pushed_with_buildah_is_pulled_from_the_host_registry(
    kind_cluster: KindCluster, ns: str
) -> None:
    tag = uuid.uuid4().hex[:8]
    ref = f"{registry.HOST}/ddp-test/busybox:{tag}"

    def buildah(*args: str) -> str:
        return subprocess.run(
            ["buildah", *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    ctr = buildah("from", "scratch")
    try:
        buildah("copy", ctr, str(helper_rootfs()), "/")
        buildah("config", "--entrypoint", '["/bin/sh"]', "--env", "PATH=/bin", ctr)
        buildah("commit", "-q", ctr, ref)
    finally:
        buildah("rm", ctr)
    try:
        buildah("push", "-q", "--tls-verify=false", ref)
    finally:
        buildah("rmi", ref)
    kind_cluster.apply(
        pod("pulled", ns, "ddp-worker2", ref, f"echo pulled {tag}", imagePullPolicy="Always")
    )

    def done() -> dict | None:
        p = kind_cluster.get("pod", "-n", ns, "pulled")
        return p if p.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

    p = kind_cluster.until("the pod of the pushed image to finish", done, ns=ns)
    assert p["status"]["phase"] == "Succeeded"
    assert p["spec"]["nodeName"] == "ddp-worker2"
    assert p["status"]["containerStatuses"][0]["imageID"].startswith(
        f"{registry.HOST}/ddp-test/busybox@sha256:"
    )
    assert kind_cluster.k("logs", "-n", ns, "pulled").strip() == f"pulled {tag}"


def test_a_read_write_once_local_path_claim_binds_and_keeps_data(
    kind_cluster: KindCluster, ns: str
) -> None:
    claim = claim_of("data", ns, "ReadWriteOnce", "standard")
    writer = pod(
        "writer",
        ns,
        None,  # scheduled: a WaitForFirstConsumer claim binds only through the scheduler
        helper_image(),
        "echo kept > /data/x && cat /data/x",
        imagePullPolicy="Never",
        volumeMounts=[{"name": "data", "mountPath": "/data"}],
    )
    writer["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
    kind_cluster.apply(claim, writer)

    def finished() -> dict | None:
        p = kind_cluster.get("pod", "-n", ns, "writer")
        return p if p.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

    p = kind_cluster.until("the writer pod on the local-path claim", finished, ns=ns)
    assert p["status"]["phase"] == "Succeeded"
    assert kind_cluster.k("logs", "-n", ns, "writer").strip() == "kept"
    pvc = kind_cluster.get("pvc", "-n", ns, "data")
    assert pvc["status"]["phase"] == "Bound"
    assert pvc["status"]["accessModes"] == ["ReadWriteOnce"]
    pv = kind_cluster.get("pv", pvc["spec"]["volumeName"])
    assert pv["spec"]["storageClassName"] == "standard"
    # local-path pins the volume to the node the pod ran on
    terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["values"] == [p["spec"]["nodeName"]]


def test_a_read_write_many_claim_is_the_same_files_on_every_machine(
    kind_cluster: KindCluster, ns: str
) -> None:
    claim = claim_of("shared", ns, "ReadWriteMany", SHARED_CLASS)
    volume = [{"name": "data", "persistentVolumeClaim": {"claimName": "shared"}}]
    mount = [{"name": "data", "mountPath": "/data"}]

    def on(node: str, name: str, script: str) -> dict:
        p = pod(name, ns, node, helper_image(), script, imagePullPolicy="Never", volumeMounts=mount)
        p["spec"]["volumes"] = volume
        return p

    def finished(name: str) -> Callable[[], dict | None]:
        def probe() -> dict | None:
            p = kind_cluster.get("pod", "-n", ns, name)
            return p if p.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

        return probe

    # Written on one worker while a pod on another reads it: both mount the claim at once.
    # (Pod names of their own: this module's namespace holds the other tests' pods.)
    kind_cluster.apply(
        claim,
        on("ddp-worker", "rwx-writer", "echo written-on-ddp-worker > /data/x && sleep 3600"),
        on("ddp-worker2", "rwx-reader", "until [ -s /data/x ]; do sleep 0.2; done; cat /data/x"),
    )
    p = kind_cluster.until("the reader on ddp-worker2", finished("rwx-reader"), ns=ns)
    assert p["status"]["phase"] == "Succeeded"
    assert kind_cluster.k("logs", "-n", ns, "rwx-reader").strip() == "written-on-ddp-worker"
    # ... and a third machine appends while the first still has it mounted.
    kind_cluster.apply(on("ddp-worker3", "rwx-appender", "echo more >> /data/x && cat /data/x"))
    kind_cluster.until("the appender on ddp-worker3", finished("rwx-appender"), ns=ns)
    out = kind_cluster.k("exec", "-n", ns, "rwx-writer", "--", "cat", "/data/x")
    assert out.split() == ["written-on-ddp-worker", "more"]
    pvc = kind_cluster.get("pvc", "-n", ns, "shared")
    assert pvc["status"]["accessModes"] == ["ReadWriteMany"]
    pv = kind_cluster.get("pv", pvc["spec"]["volumeName"])
    assert "nodeAffinity" not in pv["spec"], pv["spec"]  # not pinned to a machine
    kind_cluster.k("delete", "pod", "-n", ns, "rwx-writer", "--wait=false")
