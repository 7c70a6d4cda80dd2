"""The test kubelet runs pods as real processes: env, exit codes, restarts, deletion, DNS
across nodes, volumes, in-cluster API access, torchrun rendezvous, and a clean exit."""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ddp_devcluster import netns
from ddp_devcluster.kubelet import TestKubelet
from ddp_devcluster.plane import ControlPlane
from ddp_devcluster.polling import until

pytestmark = pytest.mark.controlplane

REPO = Path(__file__).resolve().parents[2]


def wait_for(check: Callable[[], Any], what: str, timeout_s: float = 60) -> Any:
    return until(what, check, timeout_s)


def get_pod(cp: ControlPlane, ns: str, name: str) -> dict[str, Any] | None:
    try:
        return cp.request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")  # type: ignore[no-any-return]
    except Exception:
        return None


def wait_phase(cp: ControlPlane, ns: str, name: str, *phases: str, timeout_s: float = 60) -> dict:
    def check() -> dict | None:
        pod = get_pod(cp, ns, name)
        return pod if pod and pod.get("status", {}).get("phase") in phases else None

    try:
        return wait_for(check, f"pod {name} {'/'.join(phases)}", timeout_s)  # type: ignore[no-any-return]
    except AssertionError:
        pod = get_pod(cp, ns, name)
        raise AssertionError(
            f"pod {name} not {phases}: {json.dumps((pod or {}).get('status'), indent=1)}"
        ) from None


def apply(cp: ControlPlane, ns: str, manifest: str) -> None:
    cp.kubectl("apply", "-n", ns, "-f", "-", input=manifest.replace("@NS@", ns))


@pytest.fixture
def ns(control_plane: ControlPlane) -> Iterator[str]:
    name = f"tk-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("create", "namespace", name)
    wait_for(
        lambda: (
            control_plane.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0
        ),
        "the namespace's default ServiceAccount",
    )
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false")


def pod_logs(tk: TestKubelet, ns: str, pod: str, container: str = "main") -> str:
    return tk.logs(ns, pod, container)


ENV_POD = """
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
data: {greeting: hello}
---
apiVersion: v1
kind: Pod
metadata:
  name: env
  labels: {app: env}
  annotations: {team: ddp}
spec:
  nodeSelector: {kubernetes.io/hostname: tk-0}
  restartPolicy: Never
  containers:
  - name: main
    image: ignored:latest
    command: [sh, -c]
    args:
    - |
      echo "POD_IP=$(POD_IP)"; echo "NAME=$POD_NAME"; echo "NS=$POD_NAMESPACE"
      echo "NODE=$NODE"; echo "HOST_IP=$HOST_IP"; echo "APP=$APP"; echo "TEAM=$TEAM"
      echo "GREETING=$GREETING"; echo "COMPOSED=$COMPOSED"; echo 'ESCAPED=$$(POD_IP)'
      echo "HOSTNAME=$(hostname)"; echo "FQDN=$(python -c 'import socket; print(socket.getfqdn())')"
      echo "ETH0=$(cat /sys/class/net/eth0/address >/dev/null && echo yes)"
      echo "PYTHON=$(command -v python)"
      python -c 'import ddp_trainer; print("TRAINER_IMPORTS=yes")'
    env:
    - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
    - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    - {name: POD_NAMESPACE, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
    - {name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
    - {name: HOST_IP, valueFrom: {fieldRef: {fieldPath: status.hostIP}}}
    - {name: APP, valueFrom: {fieldRef: {fieldPath: "metadata.labels['app']"}}}
    - {name: TEAM, valueFrom: {fieldRef: {fieldPath: "metadata.annotations['team']"}}}
    - {name: GREETING, valueFrom: {configMapKeyRef: {name: settings, key: greeting}}}
    - {name: COMPOSED, value: "$(GREETING)-$(POD_NAME)"}
"""


def test_env_field_refs_and_exit_zero(
    control_plane: ControlPlane, test_kubelet: TestKubelet, ns: str
) -> None:
    cp, tk = control_plane, test_kubelet
    apply(cp, ns, ENV_POD)
    pod = wait_phase(cp, ns, "env", "Succeeded")
    out = dict(line.split("=", 1) for line in pod_logs(tk, ns, "env").splitlines() if "=" in line)
    status = pod["status"]
    assert out["POD_IP"] == status["podIP"] and status["podIPs"] == [{"ip": status["podIP"]}]
    assert out["NAME"] == "env" and out["NS"] == ns and out["NODE"] == "tk-0"
    assert out["HOST_IP"] == status["hostIP"] == tk.host_ip("tk-0")
    assert out["APP"] == "env" and out["TEAM"] == "ddp"
    assert out["GREETING"] == "hello" and out["COMPOSED"] == "hello-env"
    assert out["ESCAPED"] == "$(POD_IP)"
    assert out["HOSTNAME"] == "env" and out["FQDN"] == "env"
    assert out["PYTHON"] == str(Path(sys.executable).parent / "python")
    assert out["TRAINER_IMPORTS"] == "yes"
    [cs] = status["containerStatuses"]
    assert cs["state"]["terminated"]["exitCode"] == 0
    assert cs["state"]["terminated"]["reason"] == "Completed"
    assert cs["restartCount"] == 0 and cs["ready"] is False
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Ready"]["status"] == "False" and conds["Ready"]["reason"] == "PodCompleted"
    assert status["startTime"]


EXIT_POD = """
apiVersion: v1
kind: Pod
metadata: {name: fails}
spec:
  nodeSelector: {ddp.dev/test-kubelet: "true"}
  restartPolicy: Never
  containers:
  - {name: main, image: x, command: [sh, -c, "sleep 1; exit 3"]}
"""


def test_exit_code_3_fails_the_pod(
    control_plane: ControlPlane, test_kubelet: TestKubelet, ns: str
) -> None:
    cp = control_plane
    apply(cp, ns, EXIT_POD)
    running = wait_phase(cp, ns, "fails", "Running", "Failed")
    if running["status"]["phase"] == "Running":
        conds = {c["type"]: c["status"] for c in running["status"]["conditions"]}
        assert conds["Ready"] == "True" and conds["ContainersReady"] == "True"
        assert "running" in running["status"]["containerStatuses"][0]["state"]
    pod = wait_phase(cp, ns, "fails", "Failed")
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 3 and term["reason"] == "Error"
    assert term["startedAt"] <= term["finishedAt"]


RESTART_POD = """
apiVersion: v1
kind: Pod
metadata: {name: flaky}
spec:
  nodeSelector: {ddp.dev/test-kubelet: "true"}
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
      echo $n > /scratch/n; echo "run $n"; [ $n -ge 3 ]
"""


def test_on_failure_restarts_until_success(
    control_plane: ControlPlane, test_kubelet: TestKubelet, ns: str
) -> None:
    cp, tk = control_plane, test_kubelet
    apply(cp, ns, RESTART_POD)
    pod = wait_phase(cp, ns, "flaky", "Succeeded")
    [cs] = pod["status"]["containerStatuses"]
    assert cs["restartCount"] == 2  # failed twice; the emptyDir kept the count across runs
    assert cs["state"]["terminated"]["exitCode"] == 0
    assert cs["lastState"]["terminated"]["exitCode"] == 1
    assert tk.logs(ns, "flaky", "main", restart=0).strip() == "run 1"
    assert tk.logs(ns, "flaky", "main").strip() == "run 3"


TERM_PODS = """
apiVersion: v1
kind: Pod
metadata: {name: polite}
spec:
  nodeSelector: {kubernetes.io/hostname: tk-0}
  terminationGracePeriodSeconds: 30
  volumes: [{name: out, hostPath: {path: /tmp/tk-trap-@NS@, type: DirectoryOrCreate}}]
  containers:
  - name: main
    image: x
    volumeMounts: [{name: out, mountPath: /out}]
    command: [sh, -c]
    args:
    - trap 'echo trapped > /out/polite; exit 0' TERM; echo up; while true; do sleep 0.1; done
---
apiVersion: v1
kind: Pod
metadata: {name: stubborn}
spec:
  nodeSelector: {kubernetes.io/hostname: tk-1}
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: x
    command: [python, -u, -c]
    args:
    - |
      import signal, time
      signal.signal(signal.SIGTERM, signal.SIG_IGN)
      print("up")
      time.sleep(600)
"""


def test_deletion_sigterm_then_sigkill_after_grace(
    control_plane: ControlPlane, test_kubelet: TestKubelet, ns: str
) -> None:
    cp, tk = control_plane, test_kubelet
    apply(cp, ns, TERM_PODS)
    for name in ("polite", "stubborn"):
        wait_phase(cp, ns, name, "Running")
        wait_for(lambda name=name: "up" in tk.logs(ns, name, "main"), f"{name} to start")
    t0 = time.monotonic()
    cp.kubectl("delete", "pod", "polite", "-n", ns, "--wait=true", timeout=60)
    polite_s = time.monotonic() - t0
    trapped = tk.state_dir / "nodes" / "tk-0" / "hostpath" / "tmp" / f"tk-trap-{ns}" / "polite"
    assert trapped.read_text().strip() == "trapped"
    assert not Path(f"/tmp/tk-trap-{ns}").exists()  # hostPath never touches the real path
    print(f"polite pod gone {polite_s:.1f}s after its deletion")
    t0 = time.monotonic()
    cp.kubectl("delete", "pod", "stubborn", "-n", ns, "--wait=true", timeout=60)
    stubborn_s = time.monotonic() - t0
    # It ignores SIGTERM: only SIGKILL after the grace period ends it, never sooner. (A slow
    # machine only makes it later; kubectl's own timeout fails the test if it never goes.)
    assert stubborn_s >= 2, stubborn_s
    assert get_pod(cp, ns, "stubborn") is None


DNS_PODS = """
apiVersion: v1
kind: Service
metadata: {name: echo}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector: {app: echo}
  ports: [{port: 7000}]
---
apiVersion: v1
kind: Pod
metadata: {name: server, labels: {app: echo}}
spec:
  hostname: server
  subdomain: echo
  nodeSelector: {kubernetes.io/hostname: tk-0}
  containers:
  - name: main
    image: x
    command: [python, -u, -c]
    args:
    - |
      import socket
      srv = socket.create_server(("0.0.0.0", 7000))
      print("listening", flush=True)
      while True:
          conn, peer = srv.accept()
          with conn:
              conn.sendall(conn.recv(100) + b" from " + socket.gethostname().encode())
---
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  nodeSelector: {kubernetes.io/hostname: tk-1}
  restartPolicy: OnFailure
  initContainers:
  - name: wait-for-server
    image: x
    command: [sh, -c, "until getent hosts server.echo.@NS@.svc; do sleep 0.2; done"]
  containers:
  - name: main
    image: x
    command: [python, -u, -c]
    args:
    - |
      import socket
      for name in ["echo", "echo.@NS@.svc", "echo.@NS@.svc.cluster.local",
                   "server.echo.@NS@.svc", "server.echo.@NS@.svc.cluster.local"]:
          addr = socket.gethostbyname(name)
          with socket.create_connection((name, 7000), timeout=5) as s:
              s.sendall(b"ping")
              print(name, addr, s.getpeername()[0], s.recv(100).decode(), flush=True)
      try:
          socket.gethostbyname("nosuch.@NS@.svc")
          print("nosuch resolved")
      except socket.gaierror:
          print("nosuch NXDOMAIN")
"""


def test_pods_on_two_nodes_reach_each_other_by_service_names(
    control_plane: ControlPlane, test_kubelet: TestKubelet, ns: str
) -> None:
    cp, tk = control_plane, test_kubelet
    apply(cp, ns, DNS_PODS)
    client = wait_phase(cp, ns, "client", "Succeeded", timeout_s=60)
    server = wait_phase(cp, ns, "server", "Running")
    server_ip = server["status"]["podIP"]
    assert client["status"]["podIP"] != server_ip
    assert client["spec"]["nodeName"] != server["spec"]["nodeName"]
    lines = tk.logs(ns, "client", "main").splitlines()
    assert len(lines) == 6, lines
    for line in lines[:5]:
        _name, addr, peer, reply = line.split(" ", 3)
        assert addr == peer == server_ip, line
        assert reply == "ping from server"
    assert lines[5] == "nosuch NXDOMAIN"
    [init] = client["status"]["initContainerStatuses"]
    assert init["name"] == "wait-for-server"
    assert init["state"]["terminated"]["reason"] == "Completed"
    assert server_ip in tk.logs(ns, "client", "wait-for-server")


VOLUME_PODS = """
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: shared}
spec:
  accessModes: [ReadWriteMany]
  resources: {requests: {storage: 1Gi}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: files}
data: {alpha: "first", beta.txt: "second"}
---
apiVersion: v1
kind: Pod
metadata: {name: writer}
spec:
  nodeSelector: {kubernetes.io/hostname: tk-0}
  restartPolicy: Never
  volumes: [{name: data, persistentVolumeClaim: {claimName: shared}}]
  containers:
  - name: main
    image: x
    volumeMounts: [{name: data, mountPath: /data}]
    command: [sh, -c, "echo written-by-writer > /data/note"]
---
apiVersion: v1
kind: Pod
metadata: {name: reader}
spec:
  nodeSelector: {kubernetes.io/hostname: tk-1}
  restartPolicy: Never
  volumes:
  - {name: data, persistentVolumeClaim: {claimName: shared}}
  - {name: cfg, configMap: {name: files}}
  - {name: shm, emptyDir: {medium: Memory}}
  containers:
  - name: main
    image: x
    volumeMounts:
    - {name: data, mountPath: /data}
    - {name: cfg, mountPath: /etc/tk-config}
    - {name: shm, mountPath: /dev/shm}
    command: [sh, -c]
    args:
    - |
      while [ ! -s /data/note ]; do sleep 0.2; done
      echo "note=$(cat /data/note)"
      echo "files=$(ls /etc/tk-config | tr '\\n' ' ')"
      echo "alpha=$(cat /etc/tk-config/alpha)"; echo "beta=$(cat /etc/tk-config/beta.txt)"
      echo "shm=$(stat -f -c %T /dev/shm)"
      touch /etc/tk-config/new 2>/dev/null && echo "cfg=writable" || echo "cfg=readonly"
"""


def test_claim_shared_between_pods_and_configmap_files(
    control_plane: ControlPlane, test_kubelet: TestKubelet, ns: str
) -> None:
    cp, tk = control_plane, test_kubelet
    apply(cp, ns, VOLUME_PODS)
    wait_phase(cp, ns, "writer", "Succeeded")
    wait_phase(cp, ns, "reader", "Succeeded")
    out = dict(l.split("=", 1) for l in tk.logs(ns, "reader", "main").splitlines() if "=" in l)  # noqa: E741
    assert out == {
        "note": "written-by-writer",
        "files": "alpha beta.txt ",
        "alpha": "first",
        "beta": "second",
        "shm": "tmpfs",
        "cfg": "readonly",
    }
    assert (tk.state_dir / "pvc" / ns / "shared" / "note").read_text() == "written-by-writer\n"
    pvc = cp.request("GET", f"/api/v1/namespaces/{ns}/persistentvolumeclaims/shared")
    assert pvc["status"]["phase"] == "Bound"


INCLUSTER_POD = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: pod-reader}
rules: [{apiGroups: [""], resources: [pods], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: pod-reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: pod-reader}
subjects: [{kind: ServiceAccount, name: default, namespace: "@NS@"}]
---
apiVersion: v1
kind: Pod
metadata: {name: selfie}
spec:
  nodeSelector: {ddp.dev/test-kubelet: "true"}
  restartPolicy: OnFailure
  containers:
  - name: main
    image: x
    command: [python, -u, -c]
    args:
    - |
      import os
      from kubernetes import client, config
      config.load_incluster_config()
      me = client.CoreV1Api().read_namespaced_pod(os.environ["HOSTNAME"], "@NS@")
      print("uid", me.metadata.uid, "ip", me.status.pod_ip)
"""


def test_in_cluster_config_reaches_the_api(
    control_plane: ControlPlane, test_kubelet: TestKubelet, ns: str
) -> None:
    cp, tk = control_plane, test_kubelet
    apply(cp, ns, INCLUSTER_POD)
    pod = wait_phase(cp, ns, "selfie", "Succeeded")
    assert tk.logs(ns, "selfie", "main").split() == [
        "uid",
        pod["metadata"]["uid"],
        "ip",
        pod["status"]["podIP"],
    ]


TORCHRUN = """
apiVersion: v1
kind: Service
metadata: {name: rdzv}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector: {app: rdzv}
  ports: [{port: 29400}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: script}
data:
  allreduce.py: |
    import os, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(t)
    print("rank", dist.get_rank(), "world", dist.get_world_size(), "sum", int(t.item()), flush=True)
    dist.destroy_process_group()
---
apiVersion: v1
kind: Pod
metadata: {name: store, labels: {app: rdzv}}
spec:
  nodeSelector: {kubernetes.io/hostname: tk-0}
  containers:
  - name: main
    image: x
    command: [python, -m, ddp_trainer.rdzv_store, --host, 0.0.0.0, --port, "29400"]
"""

WORKER = """
apiVersion: v1
kind: Pod
metadata: {name: worker-@I@}
spec:
  nodeSelector: {kubernetes.io/hostname: tk-@I@}
  restartPolicy: Never
  volumes: [{name: script, configMap: {name: script}}]
  containers:
  - name: main
    image: x
    volumeMounts: [{name: script, mountPath: /app}]
    env:
    - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
    - {name: TORCH_DISABLE_SHARE_RDZV_TCP_STORE, value: "1"}
    - {name: OMP_NUM_THREADS, value: "1"}
    - {name: LOGLEVEL, value: INFO}
    command: [torchrun]
    args: [--nnodes=2, --nproc-per-node=1, --rdzv-backend=c10d, --rdzv-endpoint=rdzv:29400,
           --rdzv-id=@NS@, "--rdzv-conf=is_host=false,join_timeout=120", --local-addr=$(POD_IP),
           --max-restarts=0, /app/allreduce.py]
"""


def test_torchrun_c10d_rendezvous_across_two_nodes(
    control_plane: ControlPlane, test_kubelet: TestKubelet, ns: str
) -> None:
    cp, tk = control_plane, test_kubelet
    apply(cp, ns, TORCHRUN)
    apply(cp, ns, WORKER.replace("@I@", "0") + "---" + WORKER.replace("@I@", "1"))
    for i in (0, 1):
        wait_phase(cp, ns, f"worker-{i}", "Succeeded", "Failed", timeout_s=150)
    logs = [tk.logs(ns, f"worker-{i}", "main") for i in (0, 1)]
    for i in (0, 1):
        pod = get_pod(cp, ns, f"worker-{i}")
        assert pod and pod["status"]["phase"] == "Succeeded", logs[i][-3000:]
    ranks = sorted(line for log in logs for line in log.splitlines() if line.startswith("rank"))
    assert ranks == ["rank 0 world 2 sum 3", "rank 1 world 2 sum 3"]


SLEEPER = """
apiVersion: v1
kind: Pod
metadata: {name: sleeper}
spec:
  nodeName: @NODE@
  volumes: [{name: shm, emptyDir: {medium: Memory}}, {name: deep, emptyDir: {}}]
  containers:
  - name: main
    image: x
    volumeMounts: [{name: shm, mountPath: /dev/shm}, {name: deep, mountPath: /tk-made-@NS@/deep}]
    command: [sh, -c, "sleep 300 & sleep 300; wait"]
"""


def _sleeper_running(cp: ControlPlane, tk: TestKubelet, ns: str, node: str) -> None:
    apply(cp, ns, SLEEPER.replace("@NODE@", node))
    wait_phase(cp, ns, "sleeper", "Running")
    # Running means the container started; its shell forks the two sleeps a moment later.
    wait_for(
        lambda: len(netns.processes_with_env(netns.ID_ENV, tk.instance)) >= 3,
        "the pod's shell and its two sleeps",
    )


def _removed_or_handed_over(made: Path) -> bool:
    """A mount point a kubelet created is removed at its cleanup, or, while another test
    kubelet runs (the session's), handed over to it: removing a path that may carry another
    instance's pod volumes would detach them."""
    heirs = [f for f in netns.run_dir().glob("*.mountpoints") if str(made) in f.read_text()]
    return not made.exists() or bool(heirs)


def test_nothing_remains_after_stop_or_kill(
    control_plane: ControlPlane, ns: str, tmp_path: Path
) -> None:
    cp = control_plane
    with TestKubelet(cp, nodes=["tk-solo"], state_dir=tmp_path / "a") as tk:
        _sleeper_running(cp, tk, ns, "tk-solo")
        assert tk.leftovers()  # there is something to clean up
        assert Path(f"/tk-made-{ns}/deep").is_dir()  # a mount point it had to create
    assert tk.leftovers() == []
    assert _removed_or_handed_over(Path(f"/tk-made-{ns}"))
    wait_for(lambda: get_pod(cp, ns, "sleeper") is None, "the pod of the removed node to go")
    assert cp.kubectl("get", "node", "tk-solo", check=False).returncode != 0

    # A killed agent takes its pods' processes with it (PR_SET_PDEATHSIG down to PID 1 of
    # the pod's PID namespace); the next start of any test kubelet removes the rest, and a
    # kubelet for the same node restarts the lost container as a kubelet after a reboot.
    tk = TestKubelet(cp, nodes=["tk-crash"], state_dir=tmp_path / "b").start()
    _sleeper_running(cp, tk, ns, "tk-crash")
    tk.kill()
    wait_for(lambda: not netns.processes_with_env(netns.ID_ENV, tk.instance), "pods to die")
    assert any(x.startswith("netns") for x in tk.leftovers())
    with TestKubelet(cp, nodes=["tk-crash"], state_dir=tmp_path / "c") as again:
        assert tk.leftovers() == []
        assert _removed_or_handed_over(Path(f"/tk-made-{ns}"))

        def restarted() -> dict | None:
            pod = get_pod(cp, ns, "sleeper")
            statuses = (pod or {}).get("status", {}).get("containerStatuses") or [{}]
            return pod if statuses[0].get("restartCount") == 1 else None

        cs = wait_for(restarted, "the lost container to restart")["status"]["containerStatuses"]
        assert "running" in cs[0]["state"]
        assert cs[0]["lastState"]["terminated"]["reason"] == "ContainerStatusUnknown"
        assert cs[0]["lastState"]["terminated"]["exitCode"] == 137
    assert again.leftovers() == []


LOOPBACK_POD = """
apiVersion: v1
kind: Pod
metadata: {name: lo}
spec:
  nodeName: tk-lo
  restartPolicy: Never
  containers:
  - name: main
    image: x
    command: [sh, -c, 'echo "ip=$(POD_IP)"; exit 4']
    env: [{name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}]
"""


def test_loopback_fallback_without_namespaces(
    control_plane: ControlPlane, ns: str, tmp_path: Path
) -> None:
    cp = control_plane
    with TestKubelet(cp, nodes=["tk-lo"], state_dir=tmp_path, network="loopback") as tk:
        assert tk.mode == "loopback"
        assert "WITHOUT network namespaces" in tk.agent_log.read_text()
        apply(cp, ns, LOOPBACK_POD)
        pod = wait_phase(cp, ns, "lo", "Failed")
        ip = pod["status"]["podIP"]
        assert ip.startswith("127.") and ip != "127.0.0.1"
        assert tk.logs(ns, "lo", "main").strip() == f"ip={ip}"
        term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert term["exitCode"] == 4
    assert tk.leftovers() == []
