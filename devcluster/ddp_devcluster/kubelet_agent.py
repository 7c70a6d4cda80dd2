"""The test kubelet's node agent: ``python -m ddp_devcluster kubelet ...`` (see kubelet.py).

Development and tests only, not for production. One process runs several nodes. Threads
watch the API (pods, services, claims), answer DNS, relay pods' API traffic, serve container
logs to the API server and renew node leases; the main thread alone starts and stops pod
processes (their ``PR_SET_PDEATHSIG`` is tied to the thread that forks them) and reports pod
status.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import platform
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

from ddp_trainer.contract import rfc3339

from . import certs, dns, logserver, netns, podlogs, podspec, versions
from .kubeapi import Api, ApiError, Informer
from .plane import MARKER_ENV
from .podlogs import LogRequestError

log = logging.getLogger("ddp_devcluster.kubelet")

NODE_LABEL = "ddp.dev/test-kubelet"
ALLOCATABLE = {"cpu": "64", "memory": "256Gi", "pods": "110", "ephemeral-storage": "100Gi"}
LEASE_S = 40
DEVCLUSTER_DIR = Path(__file__).resolve().parents[1]


def now() -> str:
    return rfc3339(dt.datetime.now(dt.UTC))


def now_micro() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def pod_path(ns: str, name: str) -> str:
    return f"/api/v1/namespaces/{quote(ns)}/pods/{quote(name)}"


@dataclass
class PodRuntime:
    uid: str
    ns: str
    name: str
    node: str
    dir: Path
    log_dir: Path
    start_time: str
    net: netns.PodNet | None = None
    records: dict[str, podspec.ContainerRecord] = field(default_factory=dict)
    init_records: dict[str, podspec.ContainerRecord] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    prepared: bool = False
    config_error: str | None = None
    next_prepare: float = 0.0
    kill_deadline: float | None = None
    killed: bool = False
    sandbox_gone: bool = False
    last_status: dict[str, Any] | None = None
    hostname: str = ""
    tmpfs: list[str] = field(default_factory=list)


class ApiRelay:
    """TCP relay from ``(host, port)`` to the API server on loopback: pods reach the API at
    ``kubernetes.default.svc``, which the DNS server resolves to ``host``; TLS passes
    through untouched, so the serving certificate (which names that host) is verified."""

    def __init__(self, host: str, port: int, target: tuple[str, int]) -> None:
        self.target = target
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(64)
        self.sock.settimeout(0.5)
        self.stopped = threading.Event()
        threading.Thread(target=self._serve, name="api-relay", daemon=True).start()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            conn.close()
            return
        upstream.settimeout(None)
        conn.settimeout(None)

        def pump(src: socket.socket, dst: socket.socket) -> None:
            try:
                while chunk := src.recv(65536):
                    dst.sendall(chunk)
            except OSError:
                pass
            finally:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)

        t = threading.Thread(target=pump, args=(upstream, conn), daemon=True)
        t.start()
        pump(conn, upstream)
        t.join()
        conn.close()
        upstream.close()

    def stop(self) -> None:
        self.stopped.set()
        self.sock.close()


class Agent:
    def __init__(
        self,
        kubeconfig: Path,
        nodes: list[str],
        state_dir: Path,
        *,
        labels: dict[str, str] | None = None,
        network: str = "auto",
        python_path: str = "",
        provision_pvcs: bool = True,
        delete_nodes_on_stop: bool = True,
        ready_file: Path | None = None,
        client_ca_file: Path | None = None,
        serving_ca: tuple[Path, Path] | None = None,
    ) -> None:
        self.api = Api(kubeconfig)
        self.nodes = nodes
        self.state_dir = state_dir.resolve()
        self.labels = labels or {}
        self.python_path = python_path
        self.provision_pvcs = provision_pvcs
        self.delete_nodes_on_stop = delete_nodes_on_stop
        self.ready_file = ready_file
        self.client_ca_file = client_ca_file
        self.serving_ca = serving_ca
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.runtimes: dict[str, PodRuntime] = {}
        self.node_uids: dict[str, str] = {}
        if network == "auto":
            ok, why = netns.netns_supported()
            network = "netns" if ok else "loopback"
            if not ok:
                log.warning("network namespaces unavailable (%s): falling back to loopback", why)
        self.net: netns.Network | netns.LoopbackNetwork
        if network == "netns":
            self.net = netns.Network(nodes, str(self.state_dir))
        else:
            self.net = netns.LoopbackNetwork(nodes, str(self.state_dir))
        self.mode = network
        url = urlparse(self.api.server)
        self.api_target = (url.hostname or "127.0.0.1", url.port or 443)
        self.dns: dns.DnsServer | None = None
        self.relay: ApiRelay | None = None
        self.logs: logserver.LogServer | None = None
        self.provisioned: set[str] = set()

    # -- lifecycle ------------------------------------------------------------------------
    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self._request_stop())
        signal.signal(signal.SIGINT, lambda *_: self._request_stop())
        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        try:
            self.net.setup()
            self._forget_old_pods()
            log.info(
                "instance %s, %s network, gateway %s",
                self.net.instance,
                self.mode,
                self.net.gateway,
            )
            if self.net.isolated:
                self.dns = dns.DnsServer(self.net.gateway).start()
                self.relay = ApiRelay(self.net.gateway, 443, self.api_target)
            self.logs = logserver.LogServer(
                {n: self.net.host_ip(n) for n in self.nodes},
                self._serving_tls(),
                self._container_log,
            )
            for node in self.nodes:
                self._register(node)
            self.pods = Informer(self.api, "/api/v1/pods", self.wake.set).start()
            self.services = Informer(self.api, "/api/v1/services", self.wake.set).start()
            self.claims: Informer | None = None
            if self.provision_pvcs:
                self.claims = Informer(
                    self.api, "/api/v1/persistentvolumeclaims", self.wake.set
                ).start()
            threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True).start()
            for inf in (self.pods, self.services):
                if not inf.synced.wait(60):
                    raise RuntimeError(f"could not list {inf.path}")
            self.logs.start()  # it finds pods in the pod informer
            if self.ready_file:
                self.ready_file.write_text(json.dumps(self.info()))
            log.info("nodes %s registered; watching pods", ", ".join(self.nodes))
            self._loop()
            return 0
        finally:
            self._shutdown()

    def _forget_old_pods(self) -> None:
        """Per-pod directories of an earlier agent on this state directory belong to no
        running pod now: unmount what is mounted there and remove them (claims and hostPath
        directories stay, as on a node)."""
        pods = self.state_dir / "pods"
        if self.net.isolated:
            for point in netns.mounts_under(str(pods)):
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)
        shutil.rmtree(pods, ignore_errors=True)
        pods.mkdir(parents=True)

    def info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "instance": self.net.instance,
            "mode": self.mode,
            "gateway": self.net.gateway,
            "nodes": {n: self.net.host_ip(n) for n in self.nodes},
            "kubelet_port": self.logs.port if self.logs else 0,
            "state_dir": str(self.state_dir),
        }

    def _request_stop(self) -> None:
        self.stopping.set()
        self.wake.set()

    def _shutdown(self) -> None:
        log.info("stopping: %d pods", len(self.runtimes))
        if self.logs:
            self.logs.stop()
        for rt in self.runtimes.values():
            self._signal_all(rt, signal.SIGTERM)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and any(
            p.poll() is None for rt in self.runtimes.values() for p in rt.procs.values()
        ):
            time.sleep(0.05)
        for rt in list(self.runtimes.values()):
            self._signal_all(rt, signal.SIGKILL)
            for p in rt.procs.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(5)
            self._teardown(rt, remove_dirs=True)
        self.runtimes.clear()
        for inf in ("pods", "services", "claims"):
            if getattr(self, inf, None) is not None:
                getattr(self, inf).stop()
        if self.dns:
            self.dns.stop()
        if self.relay:
            self.relay.stop()
        if self.delete_nodes_on_stop:
            for node in self.nodes:
                with contextlib.suppress(Exception):
                    self._delete_node(node)
        removed = self.net.teardown()
        log.info("stopped; removed %d leftovers", len(removed))

    def _delete_node(self, node: str) -> None:
        pods = self.api.request("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node}")
        for pod in pods.get("items") or []:
            m = pod["metadata"]
            with contextlib.suppress(ApiError):
                self.api.request(
                    "DELETE", pod_path(m["namespace"], m["name"]), {"gracePeriodSeconds": 0}
                )
        with contextlib.suppress(ApiError):
            self.api.request(
                "DELETE", f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}"
            )
        self.api.request("DELETE", f"/api/v1/nodes/{node}")

    # -- nodes ----------------------------------------------------------------------------
    def _register(self, node: str) -> None:
        labels = {
            "kubernetes.io/hostname": node,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            NODE_LABEL: "true",
            **self.labels,
        }
        cidr = self.net.pod_cidr(node)
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node, "labels": labels},
            "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
        }
        try:
            obj = self.api.request("POST", "/api/v1/nodes", body)
        except ApiError as e:
            if e.status != 409:
                raise
            obj = self.api.merge_patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": labels}})
        self.node_uids[node] = obj["metadata"]["uid"]
        self._node_status(node)
        self._renew_lease(node)

    def _node_status(self, node: str) -> None:
        t = now()

        def cond(ctype: str, status: str, reason: str, message: str) -> dict[str, str]:
            return {
                "type": ctype,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": t,
                "lastTransitionTime": t,
            }

        status = {
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "ok"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "ok"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "ok"),
                cond("Ready", "True", "KubeletReady", "ddp-devcluster test kubelet is ready"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": self.net.host_ip(node)},
                {"type": "Hostname", "address": node},
            ],
            "capacity": ALLOCATABLE,
            "allocatable": ALLOCATABLE,
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.logs.port if self.logs else 0}},
            "nodeInfo": {
                "machineID": node,
                "systemUUID": node,
                "bootID": self.net.instance,
                "kernelVersion": platform.release(),
                "osImage": "ddp-devcluster test kubelet",
                "containerRuntimeVersion": "ddp-test-kubelet://0.1",
                "kubeletVersion": f"v{versions.KUBERNETES}",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }
        self.api.request(
            "PATCH",
            f"/api/v1/nodes/{node}/status",
            {"status": status},
            "application/strategic-merge-patch+json",
        )

    def _renew_lease(self, node: str) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}"
        spec = {"holderIdentity": node, "leaseDurationSeconds": LEASE_S, "renewTime": now_micro()}
        try:
            self.api.merge_patch(path, {"spec": spec})
        except ApiError as e:
            if e.status != 404:
                raise
            owner = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": self.node_uids[node]}
            self.api.request(
                "POST",
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": node, "ownerReferences": [owner]},
                    "spec": spec,
                },
            )

    def _heartbeat(self) -> None:
        last_status = time.monotonic()
        while not self.stopping.wait(10):
            for node in self.nodes:
                try:
                    self._renew_lease(node)
                    if time.monotonic() - last_status > 30:
                        self._node_status(node)
                except Exception as e:
                    log.warning("heartbeat of %s failed: %s", node, e)
            if time.monotonic() - last_status > 30:
                last_status = time.monotonic()

    # -- the log server ------------------------------------------------------------------
    def _serving_tls(self) -> ssl.SSLContext:
        """A serving certificate for the nodes' addresses, from the cluster's CA when given
        (the API server verifies kubelets against it) or else signed by itself; clients
        must show a certificate from ``client_ca_file``, by default the kubeconfig's CA."""
        ips = tuple(self.net.host_ip(n) for n in self.nodes)
        if self.serving_ca is not None:
            ca_key, ca_cert = certs.load_ca(*(p.read_bytes() for p in self.serving_ca))
            pair = certs.issue(ca_key, ca_cert, "ddp-test-kubelet", dns=tuple(self.nodes), ips=ips)
        else:
            pair = certs.self_signed("ddp-test-kubelet", dns=tuple(self.nodes), ips=ips)
        if self.client_ca_file is not None:
            client_ca = self.client_ca_file.read_text()
        else:
            client_ca = self.api.ca_pem.decode()
        with tempfile.TemporaryDirectory() as d:
            crt, key = certs.write_pair(Path(d), "kubelet", pair)
            return logserver.tls_context(crt, key, client_ca)

    def _container_log(
        self, node: str, ns: str, name: str, container: str, previous: bool
    ) -> logserver.ContainerLog:
        """Which log file ``GET /containerLogs/ns/name/container`` on ``node`` reads (called
        from the log server's threads: it only reads the agent's state)."""
        pod = next(
            (
                p
                for p in self.pods.snapshot()
                if (p["metadata"]["namespace"], p["metadata"]["name"]) == (ns, name)
                and p.get("spec", {}).get("nodeName") == node
            ),
            None,
        )
        if pod is None:
            raise LogRequestError(404, f'pod "{name}" does not exist')
        if container not in podlogs.container_names(pod):
            raise LogRequestError(404, f'container "{container}" not found in pod "{name}"')
        uid = pod["metadata"]["uid"]
        folder = self.state_dir / "logs" / f"{ns}_{name}_{uid}" / container
        names = os.listdir(folder) if folder.is_dir() else []
        run = podlogs.pick_run(podlogs.run_numbers(names), previous, container, pod)

        def running() -> bool:
            rt = self.runtimes.get(uid)
            if rt is None or self.stopping.is_set():
                return False
            proc = rt.procs.get(container)
            rec = rt.records.get(container) or rt.init_records.get(container)
            return (
                proc is not None
                and proc.returncode is None
                and rec is not None
                and rec.restart_count == run
            )

        return logserver.ContainerLog(folder / f"{run}.log", running)

    # -- the sync loop --------------------------------------------------------------------
    def _loop(self) -> None:
        last_dns: dict[str, list[str]] | None = None
        next_pv = 0.0
        while not self.stopping.is_set():
            self.wake.wait(0.2)
            self.wake.clear()
            pods = self.pods.snapshot()
            mine = {
                p["metadata"]["uid"]: p
                for p in pods
                if p.get("spec", {}).get("nodeName") in self.nodes
            }
            for pod in mine.values():
                try:
                    self._sync(pod)
                except Exception as e:
                    log.exception(
                        "pod %s/%s: %s", pod["metadata"]["namespace"], pod["metadata"]["name"], e
                    )
            for uid in [u for u in self.runtimes if u not in mine]:
                rt = self.runtimes.pop(uid)
                log.info("pod %s/%s vanished; cleaning up", rt.ns, rt.name)
                self._signal_all(rt, signal.SIGKILL)
                for p in rt.procs.values():
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(5)
                self._teardown(rt, remove_dirs=True)
            if self.dns:
                local = {
                    u: rt.net.ip
                    for u, rt in self.runtimes.items()
                    if rt.net and not rt.sandbox_gone
                }
                table = dns.records(
                    self.services.snapshot(), pods, api_ip=self.net.gateway, local_ips=local
                )
                if table != last_dns:
                    self.dns.update(table)
                    last_dns = table
            if self.claims is not None and time.monotonic() >= next_pv:
                next_pv = time.monotonic() + 1
                with contextlib.suppress(Exception):
                    self._provision()

    def _sync(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        uid = meta["uid"]
        rt = self.runtimes.get(uid)
        phase = pod.get("status", {}).get("phase")
        if rt is None:
            if meta.get("deletionTimestamp"):
                self._delete_from_api(pod)  # nothing of it runs here (any more)
                return
            if phase in ("Succeeded", "Failed"):
                return  # ended before this kubelet started: nothing runs, nothing to do
            rt = self._new_runtime(pod)
        if meta.get("deletionTimestamp"):
            self._terminate(rt, pod)
            return
        if not rt.prepared and time.monotonic() >= rt.next_prepare:
            self._prepare(rt, pod)
        policy = spec.get("restartPolicy", "Always")
        self._reap(rt, policy)
        inits = spec.get("initContainers") or []
        irecs = [
            rt.init_records.setdefault(c["name"], podspec.ContainerRecord(c["name"])) for c in inits
        ]
        init_state = podspec.init_state(policy, irecs)
        if rt.prepared and init_state == "pending":
            rec = podspec.next_init(irecs)
            if rec is not None and self._due(rec):
                self._start(rt, pod, next(c for c in inits if c["name"] == rec.name), rec)
        elif rt.prepared and init_state == "done":
            for c in spec.get("containers") or []:
                rec = rt.records[c["name"]]
                if self._due(rec):
                    self._start(rt, pod, c, rec)
        status = self._status(rt, pod)
        if status["phase"] in ("Succeeded", "Failed") and not rt.sandbox_gone:
            self._teardown(rt, remove_dirs=False)

    @staticmethod
    def _due(rec: podspec.ContainerRecord) -> bool:
        """Whether a container should be started now (first start or a due restart); counts
        the restart."""
        if rec.running or (rec.last is not None and rec.restart_at is None):
            return False
        if rec.restart_at is not None and time.monotonic() < rec.restart_at:
            return False
        if rec.last is not None:
            rec.restart_count += 1
        return True

    def _new_runtime(self, pod: dict[str, Any]) -> PodRuntime:
        meta, spec = pod["metadata"], pod["spec"]
        uid = meta["uid"]
        rt = PodRuntime(
            uid=uid,
            ns=meta["namespace"],
            name=meta["name"],
            node=spec["nodeName"],
            dir=self.state_dir / "pods" / uid,
            log_dir=self.state_dir / "logs" / f"{meta['namespace']}_{meta['name']}_{uid}",
            start_time=now(),
            hostname=podspec.pod_hostname(pod),
        )
        rt.records = podspec.records_from_status(pod, now())
        rt.init_records = podspec.records_from_status(pod, now(), init=True)
        self.runtimes[uid] = rt
        rt.net = self.net.add_pod(rt.node)
        log.info("pod %s/%s on %s: sandbox %s", rt.ns, rt.name, rt.node, rt.net.ip)
        self._status(rt, pod)  # Pending, with the host IP, before anything starts
        return rt

    def _prepare(self, rt: PodRuntime, pod: dict[str, Any]) -> None:
        """Volumes and their files; retried every 2s while something they need is missing."""
        assert rt.net is not None
        try:
            ctx = self._context(rt, pod)
            plans = podspec.plan_volumes(pod, str(self.state_dir))
            vols = {v["name"]: v for v in pod["spec"].get("volumes") or []}
            tokens = self._tokens(pod)
            for plan in plans:
                path = Path(plan.host_path)
                if plan.is_file:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.touch()
                    continue
                path.mkdir(parents=True, exist_ok=True)
                if plan.memory and self.net.isolated and str(path) not in rt.tmpfs:
                    size = f",size={plan.size_limit}" if plan.size_limit else ""
                    subprocess.run(
                        ["mount", "-t", "tmpfs", "-o", f"mode=1777{size}", "tmpfs", str(path)],
                        check=True,
                    )
                    rt.tmpfs.append(str(path))
                if plan.kind == "files":
                    for f in podspec.volume_files(vols[plan.name], ctx, tokens):
                        target = path / f.path
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_bytes(f.data)
                        target.chmod(f.mode)
            etc = rt.dir / "etc"
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(podspec.hosts_file(pod, rt.net.ip, dns.CLUSTER_DOMAIN))
            (etc / "resolv.conf").write_text(
                podspec.resolv_conf(rt.ns, self.net.gateway, dns.CLUSTER_DOMAIN)
            )
        except (podspec.PodConfigError, ApiError, KeyError) as e:
            msg = str(e)
            if msg != rt.config_error:
                log.warning("pod %s/%s cannot start yet: %s", rt.ns, rt.name, msg)
            rt.config_error = msg
            for rec in [*rt.records.values(), *rt.init_records.values()]:
                rec.config_error = msg
            rt.next_prepare = time.monotonic() + 2
            return
        rt.prepared = True
        rt.config_error = None
        for rec in [*rt.records.values(), *rt.init_records.values()]:
            rec.config_error = None

    def _context(self, rt: PodRuntime, pod: dict[str, Any]) -> podspec.PodContext:
        assert rt.net is not None
        cms, secrets = podspec.referenced_objects(pod)
        configmaps = {
            n: o for n in cms if (o := self.api.get(f"/api/v1/namespaces/{rt.ns}/configmaps/{n}"))
        }
        secret_objs = {
            n: o for n in secrets if (o := self.api.get(f"/api/v1/namespaces/{rt.ns}/secrets/{n}"))
        }
        return podspec.PodContext(
            pod, rt.net.ip, rt.net.host_ip, configmaps, secret_objs, ALLOCATABLE
        )

    def _tokens(self, pod: dict[str, Any]) -> dict[str, str]:
        meta = pod["metadata"]
        sa = pod["spec"].get("serviceAccountName") or "default"
        out = {}
        for sat in podspec.token_requests(pod):
            body = {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {
                    "audiences": [sat["audience"]] if sat.get("audience") else [],
                    "expirationSeconds": int(sat.get("expirationSeconds", 3600)),
                    "boundObjectRef": {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": meta["name"],
                        "uid": meta["uid"],
                    },
                },
            }
            r = self.api.request(
                "POST",
                f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{sa}/token",
                body,
            )
            out[podspec.token_key(sat)] = r["status"]["token"]
        return out

    def _base_env(self, rt: PodRuntime) -> dict[str, str]:
        venv_bin = str(Path(sys.executable).parent)
        env = {
            "PATH": f"{venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root",
            "HOSTNAME": rt.hostname,
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            netns.ID_ENV: self.net.instance,
        }
        if self.python_path:
            env["PYTHONPATH"] = self.python_path
        if os.environ.get(MARKER_ENV):
            env[MARKER_ENV] = os.environ[MARKER_ENV]
        if self.net.isolated:
            host, port = "kubernetes.default.svc.cluster.local", "443"
        else:
            host, port = self.api_target[0], str(self.api_target[1])
        env |= {
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": port,
            "KUBERNETES_SERVICE_PORT_HTTPS": port,
            "KUBERNETES_PORT": f"tcp://{host}:{port}",
        }
        return env

    def _start(
        self, rt: PodRuntime, pod: dict[str, Any], c: dict[str, Any], rec: podspec.ContainerRecord
    ) -> None:
        assert rt.net is not None
        try:
            ctx = self._context(rt, pod)
            env = podspec.container_env(c, ctx, self._base_env(rt))
            argv = podspec.container_argv(c, env)
            plans = podspec.plan_volumes(pod, str(self.state_dir))
            mounts = podspec.container_mounts(c, plans, env)
        except (podspec.PodConfigError, ApiError) as e:
            rec.config_error = str(e)
            rec.restart_at = time.monotonic() + 2
            if rec.last is not None:
                rec.restart_count -= 1
            log.warning("pod %s/%s container %s: %s", rt.ns, rt.name, c["name"], e)
            return
        for m in mounts:
            with contextlib.suppress(OSError):
                Path(m.source).mkdir(parents=True, exist_ok=True)  # a subPath's directory
        etc = rt.dir / "etc"
        spec = {
            "parent_pid": os.getpid(),
            "isolate": self.net.isolated,
            "netns": rt.net.netns,
            "hostname": rt.hostname,
            "mounts": [
                {"source": str(etc / "hosts"), "target": "/etc/hosts", "readonly": False},
                {
                    "source": str(etc / "resolv.conf"),
                    "target": "/etc/resolv.conf",
                    "readonly": False,
                },
                *({"source": m.source, "target": m.target, "readonly": m.readonly} for m in mounts),
            ],
            "mountpoints_file": str(self.net.mountpoints_file),
            "cwd": c.get("workingDir") or "/",
            "argv": argv,
            "env": env,
        }
        n = rec.restart_count
        log_file = rt.log_dir / c["name"] / f"{n}.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        spec["log_times"] = str(podlogs.times_path(log_file))
        spec_file = rt.dir / "exec" / f"{c['name']}-{n}.json"
        spec_file.parent.mkdir(parents=True, exist_ok=True)
        spec_file.write_text(json.dumps(spec))
        with log_file.open("ab") as out:
            rt.procs[c["name"]] = subprocess.Popen(
                [sys.executable, "-s", "-P", "-m", "ddp_devcluster.podexec", str(spec_file)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={
                    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    "PYTHONPATH": str(DEVCLUSTER_DIR),
                    netns.ID_ENV: self.net.instance,
                    **({MARKER_ENV: os.environ[MARKER_ENV]} if os.environ.get(MARKER_ENV) else {}),
                },
                start_new_session=True,
            )
        rec.running_since = now()
        rec.restart_at = None
        rec.config_error = None
        log.info(
            "pod %s/%s: started %s (pid %d, restart %d): %s",
            rt.ns,
            rt.name,
            c["name"],
            rt.procs[c["name"]].pid,
            n,
            " ".join(argv)[:200],
        )

    def _reap(self, rt: PodRuntime, policy: str) -> None:
        for name, p in list(rt.procs.items()):
            code = p.poll()
            if code is None:
                continue
            del rt.procs[name]
            is_init = name in rt.init_records
            rec = rt.init_records[name] if is_init else rt.records[name]
            exit_code = 128 - code if code < 0 else code
            rec.previous = rec.last
            rec.last = podspec.Termination(exit_code, rec.running_since or now(), now())
            rec.running_since = None
            rule = podspec.init_policy(policy) if is_init else policy
            again = podspec.restarts(rule, exit_code) and not rt.kill_deadline
            rec.restart_at = (
                time.monotonic() + podspec.backoff_s(rec.restart_count) if again else None
            )
            log.info(
                "pod %s/%s: %s exited %d%s",
                rt.ns,
                rt.name,
                name,
                exit_code,
                " (will restart)" if again else "",
            )

    def _status(self, rt: PodRuntime, pod: dict[str, Any]) -> dict[str, Any]:
        names = [c["name"] for c in pod["spec"].get("containers") or []]
        for n in names:
            rt.records.setdefault(n, podspec.ContainerRecord(n))
        status = podspec.pod_status(
            pod,
            [rt.records[n] for n in names],
            sandbox_ready=rt.net is not None,
            pod_ip=rt.net.ip if rt.net else "",
            host_ip=self.net.host_ip(rt.node),
            start_time=rt.start_time,
            now=now(),
            inits=[
                rt.init_records.setdefault(c["name"], podspec.ContainerRecord(c["name"]))
                for c in pod["spec"].get("initContainers") or []
            ],
        )
        comparable = {k: v for k, v in status.items() if k != "conditions"} | {
            "conditions": [(c["type"], c["status"]) for c in status["conditions"]]
        }
        if comparable != rt.last_status:
            try:
                self.api.merge_patch(pod_path(rt.ns, rt.name) + "/status", {"status": status})
                rt.last_status = comparable
            except ApiError as e:
                log.warning("pod %s/%s: status update failed: %s", rt.ns, rt.name, e)
        return status

    # -- stopping -------------------------------------------------------------------------
    def _signal_all(self, rt: PodRuntime, sig: int) -> None:
        for p in rt.procs.values():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, sig)

    def _terminate(self, rt: PodRuntime, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        if rt.kill_deadline is None:
            grace = meta.get("deletionGracePeriodSeconds")
            if grace is None:
                grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
            rt.kill_deadline = time.monotonic() + float(grace)
            for rec in [*rt.records.values(), *rt.init_records.values()]:
                rec.restart_at = None
            log.info("pod %s/%s: deleting, SIGTERM, grace %ss", rt.ns, rt.name, grace)
            self._signal_all(rt, signal.SIGTERM)
        self._reap(rt, "Never")
        if rt.procs and time.monotonic() >= rt.kill_deadline and not rt.killed:
            log.info("pod %s/%s: grace period over, SIGKILL", rt.ns, rt.name)
            self._signal_all(rt, signal.SIGKILL)
            rt.killed = True
        if rt.procs:
            return
        self._status(rt, pod)
        self._teardown(rt, remove_dirs=True)
        self.runtimes.pop(rt.uid, None)
        self._delete_from_api(pod)

    def _delete_from_api(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
        try:
            self.api.request("DELETE", pod_path(meta["namespace"], meta["name"]), body)
            log.info("pod %s/%s: removed", meta["namespace"], meta["name"])
        except ApiError as e:
            if e.status not in (404, 409):
                log.warning("pod %s/%s: delete failed: %s", meta["namespace"], meta["name"], e)

    def _teardown(self, rt: PodRuntime, *, remove_dirs: bool) -> None:
        if rt.net is not None and not rt.sandbox_gone:
            self.net.remove_pod(rt.net)
            rt.sandbox_gone = True
        if remove_dirs:
            for point in rt.tmpfs:
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)
            rt.tmpfs.clear()
            shutil.rmtree(rt.dir, ignore_errors=True)

    # -- volumes: a static provisioner for claims -----------------------------------------
    def _provision(self) -> None:
        """Bind every pending claim to a new hostPath PersistentVolume under the state
        directory (the same directory pods of this kubelet mount for that claim), so the
        scheduler accepts pods that use claims; released ones are deleted."""
        assert self.claims is not None
        for pvc in self.claims.snapshot():
            meta, spec = pvc["metadata"], pvc.get("spec", {})
            if spec.get("volumeName") or pvc.get("status", {}).get("phase") != "Pending":
                continue
            if meta["uid"] in self.provisioned or spec.get("volumeMode") == "Block":
                continue
            path = (
                self.state_dir
                / "pvc"
                / podspec._safe(meta["namespace"])
                / podspec._safe(meta["name"])
            )
            path.mkdir(parents=True, exist_ok=True)
            size = (spec.get("resources", {}).get("requests") or {}).get("storage", "1Gi")
            pv = {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": f"tk-{meta['uid']}", "labels": {NODE_LABEL: "true"}},
                "spec": {
                    "capacity": {"storage": size},
                    "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": spec.get("storageClassName") or "",
                    "hostPath": {"path": str(path)},
                    "claimRef": {
                        "apiVersion": "v1",
                        "kind": "PersistentVolumeClaim",
                        "namespace": meta["namespace"],
                        "name": meta["name"],
                        "uid": meta["uid"],
                    },
                },
            }
            try:
                self.api.request("POST", "/api/v1/persistentvolumes", pv)
                log.info("claim %s/%s: provisioned %s", meta["namespace"], meta["name"], path)
            except ApiError as e:
                if e.status != 409:
                    raise
            self.provisioned.add(meta["uid"])
        pvs = self.api.request(
            "GET", f"/api/v1/persistentvolumes?labelSelector={NODE_LABEL}%3Dtrue"
        )
        for pv in pvs.get("items") or []:
            if pv.get("status", {}).get("phase") == "Released":
                with contextlib.suppress(ApiError):
                    self.api.request(
                        "DELETE", f"/api/v1/persistentvolumes/{pv['metadata']['name']}"
                    )


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="ddp-devcluster kubelet", description=__doc__)
    ap.add_argument("--kubeconfig", type=Path, required=True)
    ap.add_argument("--node", action="append", required=True, help="node name (repeatable)")
    ap.add_argument("--state-dir", type=Path, required=True)
    ap.add_argument("--label", action="append", default=[], help="extra node label k=v")
    ap.add_argument("--network", choices=["auto", "netns", "loopback"], default="auto")
    ap.add_argument("--python-path", default=os.environ.get("PYTHONPATH", ""))
    ap.add_argument("--keep-nodes", action="store_true", help="leave the Nodes on exit")
    ap.add_argument("--no-provision", action="store_true", help="do not bind pending claims")
    ap.add_argument("--ready-file", type=Path)
    ap.add_argument(
        "--client-ca-file",
        type=Path,
        help="CA of the client certificates the log server accepts (default: the kubeconfig's)",
    )
    ap.add_argument(
        "--serving-ca",
        nargs=2,
        type=Path,
        metavar=("CERT", "KEY"),
        help="CA that signs the log server's certificate (default: it signs itself)",
    )
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s test-kubelet %(message)s",
        stream=sys.stderr,
    )
    python_path = ":".join(str(Path(p).resolve()) for p in args.python_path.split(":") if p)
    agent = Agent(
        args.kubeconfig,
        args.node,
        args.state_dir,
        labels=dict(kv.split("=", 1) for kv in args.label),
        network=args.network,
        python_path=python_path,
        provision_pvcs=not args.no_provision,
        delete_nodes_on_stop=not args.keep_nodes,
        ready_file=args.ready_file,
        client_ca_file=args.client_ca_file,
        serving_ca=tuple(args.serving_ca) if args.serving_ca else None,
    )
    return agent.run()
