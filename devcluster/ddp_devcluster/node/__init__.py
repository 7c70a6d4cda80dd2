"""A real Kubernetes node on this machine (as root): kubelet, containerd and runc run the pods.

Beside an embedded control plane (:class:`ddp_devcluster.plane.ControlPlane` started with the
node's ``advertise_address``), one node is made of

* containerd 2.x with its CRI plugin and runc shim, and Debian's runc and CNI plugins
  (bridge, host-local, portmap, loopback): pods are real containers from real images;
* the kubelet of the plane's Kubernetes version (cgroupfs on this kernel's cgroup v1, every
  pod under the cgroup ``/ddp-node-<x>``), with a serving certificate from the plane's CA so
  that ``kubectl logs`` and ``exec`` work;
* kube-proxy (iptables) for ClusterIP Services, CoreDNS for Service and headless pod names,
  and local-path-provisioner binding PersistentVolumeClaims to folders on the node.

Every component runs inside one mount namespace and one network namespace of the node's own
(see :class:`configs.Layout` for its addresses), so its mounts, bridge, veths and iptables
rules never reach the host's. Images come in without a registry: ``podman save`` into
``ctr images import``. What it leaves behind after a crash is removed by
:mod:`ddp_devcluster.node.cleanup`.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import yaml

from .. import certs
from ..images import podman_env
from ..paths import cache_dir
from ..plane import MARKER_ENV, ControlPlane, Process, StartupError
from ..polling import until
from . import cleanup, configs
from .configs import Layout
from .pause import pause_archive


def _bin(tool: str, name: str) -> Path:
    from ..build import binary

    return binary(tool, name)


def missing_host_tools() -> list[str]:
    """Programs from Debian's packages that the node needs (the Makefile installs them)."""
    need = ["runc", "ip", "iptables", "conntrack", "nsenter", "unshare", "podman"]
    gone = [t for t in need if shutil.which(t) is None]
    if not Path("/usr/lib/cni/bridge").exists():
        gone.append("/usr/lib/cni/bridge (containernetworking-plugins)")
    return gone


def requirements() -> str:
    """Why a real node cannot start on this machine ("" when it can)."""
    if os.geteuid() != 0:
        return "not running as root (the node needs namespaces, cgroups and mounts)"
    gone = missing_host_tools()
    if gone:
        return f"{', '.join(gone)} missing (`make host-packages` installs them)"
    return ""


def _sh(
    *argv: str, input: bytes | None = None, check: bool = True, env: dict[str, str] | None = None
) -> str:
    proc = subprocess.run(argv, input=input, capture_output=True, check=False, env=env)
    if check and proc.returncode != 0:
        err = proc.stderr.decode(errors="replace")[-2000:]
        raise StartupError(f"{' '.join(argv)} failed (exit {proc.returncode}): {err}")
    return proc.stdout.decode(errors="replace")


def taken_subnets() -> set[int]:
    """Subnet numbers in use: by registered instances, or by links of the host's."""
    taken = {int(str(e["x"])) for e in cleanup.entries()}
    for line in _sh("ip", "-o", "link", "show").splitlines():
        name = line.split(":", 2)[1].strip().split("@")[0]
        if name.startswith("ddpn") and name[4:].isdigit():
            taken.add(int(name[4:]))
    return taken


@dataclass
class RealNode:
    """One node: :meth:`prepare`, then start a plane with ``advertise_address`` set to
    ``node.layout.host_ip``, then :meth:`start`; :meth:`stop` at the end, whatever happened.

    The subnet is picked (and the link made) before the plane starts, since the plane must
    advertise an address that pods reach. :class:`ddp_devcluster.stack.LocalStack` does
    all of this and starts the operator.
    """

    images: list[str] = field(default_factory=list)  # podman image refs to load
    # The image of local-path-provisioner's helper pods (a shell and mkdir): loaded too.
    helper_image: str = "docker.io/library/python:3.11-slim-bookworm"
    name: str = "node-0"
    log: Callable[[str], None] = print
    # Inherited like the plane's, so a test that runs the node in a subprocess finds leftovers.
    marker: str = field(default_factory=lambda: os.environ.get(MARKER_ENV) or uuid.uuid4().hex)

    layout: Layout = field(init=False)
    plane: ControlPlane | None = field(default=None, init=False)
    procs: dict[str, Process] = field(default_factory=dict, init=False)
    timings: dict[str, float] = field(default_factory=dict, init=False)
    _watchdog: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _holder: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _root: Path = field(default=Path(), init=False)
    _root_lock: IO[str] | None = field(default=None, init=False)

    # -- lifecycle -----------------------------------------------------------------------
    def prepare(self) -> Layout:
        """Pick a subnet, register the instance, make its namespaces and link."""
        why = requirements()
        if why:
            raise StartupError(f"the real node cannot start here: {why}")
        cleanup.remove_orphans()
        x = configs.pick_subnet(taken_subnets())
        self.layout = lay = Layout(x=x, state=Path(f"/var/lib/ddp-node/{x}"), name=self.name)
        entry = {
            "x": x,
            "owner": os.getpid(),
            "marker": self.marker,
            "netns": lay.netns,
            "host_link": lay.host_link,
            "cgroup": lay.cgroup_root,
            "state": str(lay.state),
        }
        entry_file = cleanup.record(entry)
        self._watchdog = cleanup.spawn_watchdog(os.getpid(), entry_file)
        try:
            shutil.rmtree(lay.state, ignore_errors=True)
            for d in ("pki", "containerd", "cni/net.d", "cni/ipam", "kubelet", "pod-logs"):
                lay.path(*d.split("/")).mkdir(parents=True, exist_ok=True)
            lay.path("volumes").mkdir(mode=0o755)
            self._make_network()
            self._make_cgroups()
        except BaseException:
            self.stop()
            raise
        return lay

    def start(self, plane: ControlPlane) -> RealNode:
        """Start the node's components against ``plane`` and wait for the node to be Ready."""
        self.plane = plane
        t0 = time.monotonic()
        try:
            self._write_identities()
            self._start_holder()
            self._prepare_images()
            self._start_containerd()
            self._apply(configs.rbac_objects())
            self._start_kubelet()
            self._start_kube_proxy()
            self._start_coredns()
            self._start_provisioner()
            until(
                f"node {self.name} Ready",
                self._ready,
                180,
                1.0,
                detail=lambda: self.procs["kubelet"].tail(40),
            )
        except BaseException:
            self.stop()
            raise
        self.timings["start_s"] = time.monotonic() - t0
        self.log(
            f"node {self.name} Ready in {self.timings['start_s']:.1f}s at {self.layout.node_ip}"
        )
        return self

    def stop(self) -> None:
        for name in reversed(list(self.procs)):
            self.procs[name].stop(grace_s=10)
        self.procs.clear()
        if self._holder is not None and self._holder.poll() is None:
            self._holder.kill()
            self._holder.wait()
        if not hasattr(self, "layout"):
            return  # prepare() never got as far as registering anything
        entry_file = cleanup.registry() / f"{self.layout.x}.json"
        if entry_file.exists():
            cleanup.remove(json.loads(entry_file.read_text()))
        if self._watchdog is not None:
            self._watchdog.kill()
            self._watchdog.wait()
        if self._root_lock is not None:
            self._root_lock.close()  # the shared image store is free for the next node
            self._root_lock = None

    # -- the machine's side ----------------------------------------------------------------
    def _make_network(self) -> None:
        lay = self.layout
        ns = ["ip", "netns", "exec", lay.netns]
        _sh("ip", "netns", "add", lay.netns)
        _sh(
            "ip",
            "link",
            "add",
            lay.host_link,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            lay.netns,
        )
        _sh("ip", "addr", "add", f"{lay.host_ip}/24", "dev", lay.host_link)
        _sh("ip", "link", "set", lay.host_link, "up")
        _sh(*ns, "ip", "link", "set", "lo", "up")
        _sh(*ns, "ip", "addr", "add", f"{lay.node_ip}/24", "dev", "eth0")
        _sh(*ns, "ip", "link", "set", "eth0", "up")
        _sh(*ns, "ip", "route", "add", "default", "via", lay.host_ip)
        # The host reaches pods (the tests scrape them) through the node.
        _sh("ip", "route", "add", lay.pod_cidr, "via", lay.node_ip)
        for key, value in {
            "net.ipv4.ip_forward": "1",
            "net.bridge.bridge-nf-call-iptables": "1",
            "net.ipv4.conf.all.route_localnet": "1",
        }.items():
            _sh(
                *ns,
                "sysctl",
                "-q",
                "-w",
                f"{key}={value}",
                check=key != "net.bridge.bridge-nf-call-iptables",
            )

    def _make_cgroups(self) -> None:
        rel = self.layout.cgroup_root.strip("/")
        for hierarchy in sorted(cleanup.CGROUP_ROOT.iterdir()):
            if not (hierarchy / "cgroup.procs").exists():
                continue
            d = hierarchy / rel
            d.mkdir(exist_ok=True)
            if hierarchy.name == "cpuset":  # a new cpuset starts empty: inherit the parent's
                for f in ("cpuset.cpus", "cpuset.mems"):
                    (d / f).write_text((hierarchy / f).read_text())

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBECONFIG")}
        env[MARKER_ENV] = self.marker
        env["PATH"] = f"{_bin('containerd', 'containerd').parent}:{env.get('PATH', '')}"
        return env

    def _start_holder(self) -> None:
        """A process that owns the node's mount namespace (private: nothing leaks out)."""
        self._holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", "sleep", "infinity"],
            env=self._env(),
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        until("node mount namespace", lambda: self._own_mount_ns(), 10, 0.05)

    def _own_mount_ns(self) -> bool:
        assert self._holder is not None
        try:
            mine = os.readlink("/proc/self/ns/mnt")
            theirs = os.readlink(f"/proc/{self._holder.pid}/ns/mnt")
        except OSError:
            return False
        return mine != theirs

    def _spawn(self, name: str, argv: list[str]) -> Process:
        assert self._holder is not None
        inside = [
            "nsenter",
            f"--mount=/proc/{self._holder.pid}/ns/mnt",
            f"--net=/run/netns/{self.layout.netns}",
            "--",
            *argv,
        ]
        p = Process(name, inside, self.layout.path(f"{name}.log"), self._env())
        p.start()
        self.procs[name] = p
        return p

    def _kubeconfig(self, stem: str) -> Path:
        return self.layout.path("pki", f"{stem}.kubeconfig")

    def _write_identities(self) -> None:
        assert self.plane is not None
        lay, plane = self.layout, self.plane
        ca_key, ca_cert = certs.load_ca(plane.ca_file.read_bytes(), plane.ca_key_file.read_bytes())
        server = f"https://{lay.host_ip}:{plane.apiserver_port}"
        for stem, (user, groups) in configs.node_certificates(lay).items():
            pair = certs.issue(ca_key, ca_cert, user, groups)
            self._kubeconfig(stem).write_text(
                certs.kubeconfig(server, plane.ca_pem, user, client=pair)
            )
        serving = certs.issue(ca_key, ca_cert, lay.name, dns=(lay.name,), ips=(lay.node_ip,))
        certs.write_pair(lay.path("pki"), "kubelet", serving)
        lay.path("resolv.conf").write_text("# pods resolve through the cluster DNS only\n")

    # -- components ------------------------------------------------------------------------
    def _ctr_argv(self, *args: str) -> list[str]:
        assert self._holder is not None
        return [
            "nsenter",
            f"--mount=/proc/{self._holder.pid}/ns/mnt",
            "--",
            str(_bin("containerd", "ctr")),
            "--address",
            str(self.layout.containerd_socket),
            "--namespace",
            "k8s.io",
            *args,
        ]

    def _ctr(self, *args: str) -> str:
        return _sh(*self._ctr_argv(*args))

    def _with_progress(
        self, argv: list[str], what: str, grows: Path | None, env: dict[str, str] | None = None
    ) -> None:
        """Runs a long command, with a log line every 15 s (and the size of ``grows``)."""
        t0 = time.monotonic()
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env)
            while True:
                try:
                    proc.wait(15)
                    break
                except subprocess.TimeoutExpired:
                    took = time.monotonic() - t0
                    size = grows.stat().st_size if grows and grows.exists() else 0
                    rate = f", {size / 1e9:.2f} GB at {size / 1e6 / took:.0f} MB/s" if size else ""
                    self.log(f"node {self.name}: {what}: {took:.0f}s{rate}")
            if proc.returncode != 0:
                err.seek(0)
                tail = err.read().decode(errors="replace")[-2000:]
                raise StartupError(f"{what} failed (exit {proc.returncode}): {tail}")

    def _containerd_root(self) -> Path:
        """The shared image store under the cache when no other node holds it, else a private
        one: importing the trainer image (5 GB) takes minutes, so it is done once."""
        shared = cache_dir() / "node" / "containerd"
        shared.mkdir(parents=True, exist_ok=True)
        self._root_lock = (shared.parent / "containerd.lock").open("w")
        try:
            fcntl.flock(self._root_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._root_lock.close()
            self._root_lock = None
            return self.layout.path("containerd", "root")
        return shared

    def _run_containerd(self, root: Path, cri: bool) -> Process:
        lay = self.layout
        cfg = lay.path("containerd", "config.toml")
        runc = shutil.which("runc") or "runc"
        cfg.write_text(configs.containerd_config(lay, runc, root, cri=cri))
        lay.containerd_socket.unlink(missing_ok=True)
        proc = self._spawn(
            "containerd", [str(_bin("containerd", "containerd")), "--config", str(cfg)]
        )
        until(
            "containerd's socket",
            lambda: lay.containerd_socket.exists() or self._died("containerd"),
            30,
            0.1,
            detail=lambda: proc.tail(30),
        )
        return proc

    def _prepare_images(self) -> None:
        """Without the CRI plugin: forget the containers of earlier instances (their pods are
        gone), and import the images that the store lacks or has in another version."""
        t0 = time.monotonic()
        self._root = self._containerd_root()
        proc = self._run_containerd(self._root, cri=False)
        stale = self._ctr("containers", "list", "--quiet").split()
        if stale:
            self._ctr("containers", "delete", *stale)
        known = set(self._ctr("images", "list", "--quiet").split())
        stamps = self._root / "ddp-imported.json"
        imported: dict[str, str] = json.loads(stamps.read_text()) if stamps.exists() else {}
        self._ctr("images", "import", str(pause_archive()))
        for ref in dict.fromkeys([*self.images, self.helper_image]):
            image_id = _sh(
                "podman", "image", "inspect", "--format", "{{.Id}}", ref, env=podman_env()
            ).strip()
            if imported.get(ref) == image_id and ref in known:
                continue
            t1 = time.monotonic()
            self.log(f"node {self.name}: importing {ref} into containerd")
            archive = self.layout.path("containerd", "import.tar")
            self._with_progress(
                ["podman", "save", "--format", "docker-archive", "-o", str(archive), ref],
                f"podman save {ref}",
                archive,
                env=podman_env(),
            )
            self._with_progress(
                self._ctr_argv("images", "import", str(archive)), f"ctr import {ref}", None
            )
            archive.unlink()
            imported[ref] = image_id
            stamps.write_text(json.dumps(imported, indent=1))
            self.log(f"node {self.name}: {ref} imported in {time.monotonic() - t1:.0f}s")
        proc.stop(grace_s=10)
        del self.procs["containerd"]
        self.timings["images_s"] = time.monotonic() - t0

    def _start_containerd(self) -> None:
        (self.layout.path("cni", "net.d") / "10-ddp-node.conflist").write_text(
            json.dumps(configs.cni_config(self.layout), indent=1)
        )
        self._run_containerd(self._root, cri=True)

    def _died(self, name: str) -> bool:
        if not self.procs[name].alive():
            raise StartupError(f"{name} exited:\n{self.procs[name].tail(40)}")
        return False

    def _apply(self, objects: list[dict[str, object]]) -> None:
        assert self.plane is not None
        self.plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))

    def _start_kubelet(self) -> None:
        assert self.plane is not None
        lay = self.layout
        cfg = lay.path("kubelet-config.yaml")
        cfg.write_text(yaml.safe_dump(configs.kubelet_config(lay, self.plane.ca_file)))
        self._spawn(
            "kubelet",
            [
                str(_bin("kubernetes-node", "kubelet")),
                f"--config={cfg}",
                f"--kubeconfig={self._kubeconfig('kubelet')}",
                f"--root-dir={lay.path('kubelet')}",
                f"--hostname-override={lay.name}",
                f"--node-ip={lay.node_ip}",
                "--v=1",
            ],
        )

    def _start_kube_proxy(self) -> None:
        lay = self.layout
        cfg = lay.path("kube-proxy-config.yaml")
        cfg.write_text(
            yaml.safe_dump(configs.kube_proxy_config(lay, self._kubeconfig("kube-proxy")))
        )
        self._spawn(
            "kube-proxy", [str(_bin("kubernetes-node", "kube-proxy")), f"--config={cfg}", "--v=1"]
        )

    def _start_coredns(self) -> None:
        corefile = self.layout.path("Corefile")
        corefile.write_text(configs.corefile(self._kubeconfig("coredns")))
        self._spawn("coredns", [str(_bin("coredns", "coredns")), "-conf", str(corefile)])

    def _start_provisioner(self) -> None:
        lay = self.layout
        helper = self.helper_image
        self._apply(configs.provisioner_objects(helper))
        cfg = lay.path("local-path-config.json")
        cfg.write_text(json.dumps(configs.provisioner_config(lay)))
        self._spawn(
            "local-path-provisioner",
            [
                str(_bin("local-path-provisioner", "local-path-provisioner")),
                "start",
                f"--config={cfg}",
                f"--kubeconfig={self._kubeconfig('local-path-provisioner')}",
                f"--provisioner-name={configs.PROVISIONER}",
                f"--namespace={configs.PROVISIONER_NAMESPACE}",
                f"--helper-image={helper}",
                "--service-account-name=local-path-provisioner",
            ],
        )

    def _ready(self) -> bool:
        assert self.plane is not None
        for name in self.procs:
            self._died(name)
        out = self.plane.kubectl(
            "get", "node", self.name, "-o",
            "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
            check=False,
        )  # fmt: skip
        return out.stdout.strip() == "True"
