"""The embedded control plane is a real cluster: scheduling, garbage collection, RBAC, tokens."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from ddp_devcluster.plane import ControlPlane
from ddp_devcluster.polling import TimedOut, until

pytestmark = pytest.mark.controlplane


def get(cp: ControlPlane, *args: str) -> dict:
    return json.loads(cp.kubectl("get", *args, "-o", "json").stdout)


POD = """
apiVersion: v1
kind: Pod
metadata: {name: hello, namespace: default}
spec:
  containers:
  - name: main
    image: busybox
    command: [sh, -c, "echo hi"]
"""


def test_applied_pod_is_scheduled_on_a_kwok_node_and_runs(control_plane: ControlPlane) -> None:
    cp = control_plane
    assert "pod/hello created" in cp.kubectl("apply", "-f", "-", input=POD).stdout
    until("Running", lambda: get(cp, "pod", "hello")["status"].get("phase") == "Running", 30)
    pod = get(cp, "pod", "hello")
    assert pod["spec"]["nodeName"].startswith("kwok-node-")
    assert pod["status"]["podIP"]
    # A test finishes a pod as a kubelet would; kwok records the exit code.
    cp.kubectl("annotate", "pod", "hello", "kwok.ddp.dev/exit-code=3")
    until("Failed", lambda: get(cp, "pod", "hello")["status"]["phase"] == "Failed", 30)
    state = get(cp, "pod", "hello")["status"]["containerStatuses"][0]["state"]
    assert state["terminated"]["exitCode"] == 3
    cp.kubectl("delete", "pod", "hello", "--wait=true", timeout=60)


@pytest.mark.parametrize("action", ["exit", "delete"])
def test_a_late_kwok_action_never_reaches_the_pod_made_next_under_the_same_name(
    control_plane: ControlPlane, action: str
) -> None:
    """kwok acts by name and plays what it saw while it was held up; a kubelet acts on a uid.
    The old pod is ended (or deleted) while kwok is stopped, then forced away and a new one
    made under its name: kwok, resumed, plays the old pod's stage, which the uid test in our
    stages refuses. Without it the new pod was deleted in 10 of 10 tries.

    Whether kwok plays the old pod's stage at all is up to kwok (the new pod's own event may
    cancel it first), so a try counts once kwok has marked the new pod Running and either
    refused the late action or gone on for a second; the new pod must survive every try, and
    kwok must have played (and been refused) in at least one of five."""
    cp = control_plane
    kwok = cp.procs["kwok"]
    assert kwok.popen is not None
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "main", "image": "busybox"}]}}  # fmt: skip
    refusals = 0
    for attempt in range(5):
        ns = f"late-{action}-{attempt}"
        cp.kubectl("create", "namespace", ns)
        made = json.dumps({**pod, "metadata": {"name": "p", "namespace": ns}})
        cp.kubectl("create", "-f", "-", input=made)

        def running(ns: str = ns) -> bool:
            return state(cp, ns, None) == "Running"

        until("the old pod Running", running, 30)
        seen = len(kwok.tail(1_000_000).splitlines())
        os.killpg(kwok.popen.pid, signal.SIGSTOP)
        try:
            if action == "exit":
                cp.kubectl("annotate", "pod", "p", "-n", ns, "kwok.ddp.dev/exit-code=137")
            else:
                cp.kubectl("delete", "pod", "p", "-n", ns, "--wait=false")
            # (once seen gone already, 1 run in 4 on 2026-11-27: then there is nothing to force)
            cp.kubectl(
                "delete", "pod", "p", "-n", ns, "--grace-period=0", "--force", "--ignore-not-found"
            )
            cp.kubectl("create", "-f", "-", input=made)
            new = get(cp, "pod", "p", "-n", ns)["metadata"]["uid"]
        finally:
            os.killpg(kwok.popen.pid, signal.SIGCONT)

        def refused(ns: str = ns, seen: int = seen) -> bool:
            lines = kwok.tail(1_000_000).splitlines()[seen:]
            return any(f'"pod":"{ns}/p"' in x and "rejected our request" in x for x in lines)

        def marked(ns: str = ns, uid: str = new) -> bool:
            return state(cp, ns, uid) != "Pending"

        until("kwok to mark the new pod", marked, 30)
        with contextlib.suppress(TimedOut):  # kwok may have cancelled the late action instead
            until("kwok's late action", refused, 1.0, interval_s=0.1)
        assert state(cp, ns, new) == "Running", f"try {attempt}"
        refusals += refused()
        cp.kubectl("delete", "namespace", ns, "--wait=false")
    assert refusals >= 1, "kwok never played the old pod's stage: nothing was shown"


def state(cp: ControlPlane, ns: str, uid: str | None) -> str:
    """The phase of pod ``p`` of ``ns`` if it is the pod ``uid`` (any, for None) and not being
    deleted; else what became of it."""
    r = cp.kubectl("get", "pod", "p", "-n", ns, "-o", "json", check=False)
    if r.returncode != 0:
        return "gone"
    now = json.loads(r.stdout)
    if uid is not None and now["metadata"]["uid"] != uid:
        return "another pod"
    if "deletionTimestamp" in now["metadata"]:
        return "being deleted"
    return str(now["status"].get("phase"))


def test_deleting_an_owner_deletes_its_dependents(control_plane: ControlPlane) -> None:
    cp = control_plane
    cp.kubectl("create", "configmap", "owner", "--from-literal=a=b")
    uid = get(cp, "configmap", "owner")["metadata"]["uid"]
    dependent = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "dependent",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}
            ],
        },
    }
    cp.kubectl("apply", "-f", "-", input=json.dumps(dependent))
    cp.kubectl("delete", "configmap", "owner")

    def gone() -> bool:
        r = cp.kubectl("get", "configmap", "dependent", check=False)
        return r.returncode != 0 and "NotFound" in r.stderr

    until("the garbage collector to delete the dependent", gone, 60)


def test_service_account_without_a_role_is_forbidden(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    cp = control_plane
    cp.kubectl("create", "namespace", "rbac-check")
    cp.kubectl("create", "serviceaccount", "nobody", "-n", "rbac-check")
    kc = cp.token_kubeconfig("rbac-check", "nobody", tmp_path / "nobody.kubeconfig")

    denied = cp.kubectl("get", "pods", "-n", "rbac-check", kubeconfig=kc, check=False)
    assert denied.returncode != 0
    assert "forbidden" in denied.stderr.lower()
    assert "system:serviceaccount:rbac-check:nobody" in denied.stderr

    # The same token is allowed once a role grants exactly that: the token authenticates,
    # and RBAC alone decides.
    cp.kubectl("create", "role", "pod-reader", "--verb=list", "--resource=pods", "-n", "rbac-check")
    cp.kubectl(
        "create",
        "rolebinding",
        "nobody-reads",
        "--role=pod-reader",
        "--serviceaccount=rbac-check:nobody",
        "-n",
        "rbac-check",
    )
    until(
        "the RoleBinding to take effect",
        lambda: (
            cp.kubectl("get", "pods", "-n", "rbac-check", kubeconfig=kc, check=False).returncode
            == 0
        ),
        30,
    )
    still_denied = cp.kubectl("get", "secrets", "-n", "rbac-check", kubeconfig=kc, check=False)
    assert "forbidden" in still_denied.stderr.lower()


def test_kubectl_and_server_are_the_pinned_version(control_plane: ControlPlane) -> None:
    from ddp_devcluster import versions

    out = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    assert out["serverVersion"]["gitVersion"] == f"v{versions.KUBERNETES}"
    assert out["clientVersion"]["gitVersion"] == f"v{versions.KUBERNETES}"


def test_cluster_up_and_down_from_the_command_line(tmp_path: Path) -> None:
    """`make cluster-up` / `make cluster-down` use this; a separate state dir keeps it apart."""
    import os
    import sys

    env = {**os.environ, "DDP_CACHE_RUN": str(tmp_path)}
    up = subprocess.run(
        [sys.executable, "-m", "ddp_devcluster", "up", "--nodes", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert up.returncode == 0, up.stdout + up.stderr
    line = next(x for x in up.stdout.splitlines() if x.startswith("export KUBECONFIG="))
    kubeconfig = line.split("=", 1)[1]
    try:
        from ddp_devcluster.plane import kubectl_path

        nodes = subprocess.run(
            [kubectl_path(), f"--kubeconfig={kubeconfig}", "get", "nodes", "-o", "name"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert nodes.split() == ["node/kwok-node-0"]
    finally:
        down = subprocess.run(
            [sys.executable, "-m", "ddp_devcluster", "down"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert down.returncode == 0 and "stopped" in down.stdout, down.stdout + down.stderr
    assert not Path(kubeconfig).exists()


def test_helm_is_built_at_its_pin() -> None:
    from ddp_devcluster import versions
    from ddp_devcluster.plane import binary

    out = subprocess.run(
        [str(binary("helm")), "version", "--short"], capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith(f"v{versions.HELM}")
