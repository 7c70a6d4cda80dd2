"""``kubectl logs`` on pods of the test kubelet, through the real API server: what a container
printed, with time stamps, tail, byte and time limits, follow, the previous run, and errors."""

from __future__ import annotations

import datetime as dt
import json
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddp_devcluster import podspec
from ddp_devcluster.kubelet import TestKubelet
from ddp_devcluster.plane import ControlPlane, kubectl_path
from ddp_devcluster.polling import until

pytestmark = pytest.mark.controlplane


@pytest.fixture
def ns(control_plane: ControlPlane) -> Iterator[str]:
    name = f"tkl-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("create", "namespace", name)
    until(
        "the namespace's default ServiceAccount",
        lambda: (
            control_plane.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0
        ),
    )
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false")


def apply(cp: ControlPlane, ns: str, manifest: str) -> None:
    cp.kubectl("apply", "-n", ns, "-f", "-", input=manifest)


def pod_status(cp: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    out = cp.kubectl("get", "pod", name, "-n", ns, "-o", "json", check=False)
    return json.loads(out.stdout).get("status", {}) if out.returncode == 0 else {}


def wait_phase(cp: ControlPlane, ns: str, name: str, phase: str) -> dict[str, Any]:
    return until(
        f"pod {name} {phase}",
        lambda: (s := pod_status(cp, ns, name)).get("phase") == phase and s,
        detail=lambda: json.dumps(pod_status(cp, ns, name), indent=1),
    )


def logs(cp: ControlPlane, ns: str, pod: str, *flags: str) -> str:
    return cp.kubectl("logs", "-n", ns, pod, *flags).stdout


def stamp(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


PRINTER = """
apiVersion: v1
kind: Pod
metadata: {name: printer}
spec:
  nodeSelector: {kubernetes.io/hostname: tk-0}
  restartPolicy: Never
  containers:
  - name: main
    image: x
    command: [sh, -c, 'echo "line 1"; echo "line 2" >&2; sleep 1; echo "line 3"']
"""


def test_kubectl_logs_reads_what_the_container_printed(
    control_plane: ControlPlane, test_kubelet: TestKubelet, ns: str
) -> None:
    cp, tk = control_plane, test_kubelet
    port = cp.kubectl(
        "get", "node", "tk-0", "-o", "jsonpath={.status.daemonEndpoints.kubeletEndpoint.Port}"
    ).stdout
    assert int(port) == tk.port > 0
    apply(cp, ns, PRINTER)
    term = wait_phase(cp, ns, "printer", "Succeeded")["containerStatuses"][0]["state"]
    assert logs(cp, ns, "printer") == "line 1\nline 2\nline 3\n"
    assert logs(cp, ns, "printer") == tk.logs(ns, "printer", "main")  # the file stays plain

    stamped = logs(cp, ns, "printer", "--timestamps").splitlines()
    assert [line.split(" ", 1)[1] for line in stamped] == ["line 1", "line 2", "line 3"]
    times = [stamp(line.split(" ", 1)[0]) for line in stamped]
    assert times == sorted(times)
    started = stamp(term["terminated"]["startedAt"])
    finished = stamp(term["terminated"]["finishedAt"])
    second = dt.timedelta(seconds=1)  # the status has whole seconds
    assert started - second <= times[0] and times[-1] <= finished + second
    assert times[2] - times[1] > dt.timedelta(seconds=0.5)  # each line has its own time

    assert logs(cp, ns, "printer", "--tail=1") == "line 3\n"
    assert logs(cp, ns, "printer", "--tail=0") == ""
    assert logs(cp, ns, "printer", "--limit-bytes=9") == "line 1\nli"
    assert logs(cp, ns, "printer", "--since=1h") == "line 1\nline 2\nline 3\n"
    after = (times[-1] + 2 * second).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert logs(cp, ns, "printer", f"--since-time={after}") == ""


WAITER = """
apiVersion: v1
kind: Pod
metadata: {name: waiter}
spec:
  nodeSelector: {kubernetes.io/hostname: tk-1}
  restartPolicy: Never
  volumes: [{name: signal, hostPath: {path: /signal, type: DirectoryOrCreate}}]
  containers:
  - name: main
    image: x
    volumeMounts: [{name: signal, mountPath: /signal}]
    command: [sh, -c]
    args: ['echo first; while [ ! -e /signal/go ]; do sleep 0.1; done; echo second']
"""


def test_kubectl_logs_follow_streams_until_the_container_exits(
    control_plane: ControlPlane, test_kubelet: TestKubelet, ns: str
) -> None:
    cp, tk = control_plane, test_kubelet
    apply(cp, ns, WAITER)
    wait_phase(cp, ns, "waiter", "Running")
    pod = json.loads(cp.kubectl("get", "pod", "waiter", "-n", ns, "-o", "json").stdout)
    plans = podspec.plan_volumes(pod, str(tk.state_dir))  # where the kubelet keeps /signal
    [signal] = [p for p in plans if p.name == "signal"]
    follow = subprocess.Popen(
        [kubectl_path(), f"--kubeconfig={cp.kubeconfig}", "logs", "-f", "-n", ns, "waiter"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(follow.stdout or []), daemon=True)
    try:
        reader.start()
        until("the follow to show the first line", lambda: lines == ["first\n"])
        assert follow.poll() is None  # still following the running container
        (Path(signal.host_path) / "go").touch()  # only now does the container go on
        until(
            "the follow to end",
            lambda: follow.poll() is not None,
            detail=lambda: f"follow printed {lines}; {pod_status(cp, ns, 'waiter')}",
        )
        reader.join(10)
        assert follow.returncode == 0, follow.stderr.read() if follow.stderr else ""
        assert lines == ["first\n", "second\n"]
        assert pod_status(cp, ns, "waiter")["phase"] == "Succeeded"
    finally:
        follow.kill()
        follow.wait()


RESTARTER = """
apiVersion: v1
kind: Pod
metadata: {name: restarter}
spec:
  nodeSelector: {kubernetes.io/hostname: tk-0}
  restartPolicy: OnFailure
  volumes: [{name: scratch, emptyDir: {}}]
  containers:
  - name: main
    image: x
    volumeMounts: [{name: scratch, mountPath: /scratch}]
    command: [sh, -c]
    args:
    - |
      n=$(( $(cat /scratch/n 2>/dev/null || echo 0) + 1 ))
      echo $n > /scratch/n; echo "run $n"
      [ $n -ge 2 ] || exit 1
      exec sleep 600
"""


def test_kubectl_logs_previous_shows_the_run_before_a_restart(
    control_plane: ControlPlane, test_kubelet: TestKubelet, ns: str
) -> None:
    cp = control_plane

    def restarted_and_running() -> bool:
        [cs] = pod_status(cp, ns, "restarter").get("containerStatuses") or [{}]
        return cs.get("restartCount") == 1 and "running" in cs.get("state", {})

    apply(cp, ns, RESTARTER)
    until("the container's second run", restarted_and_running)
    until("the second run's line", lambda: logs(cp, ns, "restarter") == "run 2\n")
    assert logs(cp, ns, "restarter", "--previous") == "run 1\n"
    assert logs(cp, ns, "restarter", "--previous", "--timestamps").endswith("Z run 1\n")


def test_missing_containers_and_runs_get_clear_errors(
    control_plane: ControlPlane, test_kubelet: TestKubelet, ns: str
) -> None:
    cp, tk = control_plane, test_kubelet
    apply(cp, ns, PRINTER)
    wait_phase(cp, ns, "printer", "Succeeded")
    out = cp.kubectl("logs", "-n", ns, "printer", "-c", "nope", check=False)
    assert out.returncode != 0 and "container nope is not valid for pod printer" in out.stderr
    out = cp.kubectl("logs", "-n", ns, "printer", "--previous", check=False)
    assert out.returncode != 0
    assert 'previous terminated container "main" in pod "printer" not found' in out.stderr

    # The kubelet itself, as the API server calls it: its certificate names the node's
    # address and is signed by the plane's CA; it wants a client certificate from that CA.
    tls = ssl.create_default_context(cafile=str(cp.ca_file))
    tls.load_cert_chain(*map(str, cp.admin_cert))
    base = f"https://{tk.host_ip('tk-0')}:{tk.port}/containerLogs/{ns}/printer"
    with urllib.request.urlopen(f"{base}/main?tailLines=1", context=tls, timeout=30) as r:
        assert r.read() == b"line 3\n"
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{base}/nope", context=tls, timeout=30)
    assert e.value.code == 404
    assert e.value.read().decode() == 'container "nope" not found in pod "printer"'
    anonymous = ssl.create_default_context(cafile=str(cp.ca_file))
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"{base}/main", context=anonymous, timeout=30).read()


LOOPBACK_PRINTER = """
apiVersion: v1
kind: Pod
metadata: {name: lo-printer}
spec:
  nodeName: tk-lo-logs
  restartPolicy: Never
  containers:
  - {name: main, image: x, command: [sh, -c, 'echo "on loopback"']}
"""


def test_kubectl_logs_on_a_second_kubelet_without_namespaces(
    control_plane: ControlPlane, test_kubelet: TestKubelet, ns: str, tmp_path: Path
) -> None:
    """Beside the session's kubelet (both serve logs at once), in the loopback fallback."""
    cp = control_plane
    with TestKubelet(cp, nodes=["tk-lo-logs"], state_dir=tmp_path, network="loopback") as tk:
        apply(cp, ns, LOOPBACK_PRINTER)
        wait_phase(cp, ns, "lo-printer", "Succeeded")
        assert logs(cp, ns, "lo-printer") == "on loopback\n"
    assert tk.leftovers() == []
