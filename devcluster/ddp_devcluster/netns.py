"""Pod networks for the test kubelet (development and tests only).

As root, every pod gets a network namespace with one veth into a bridge that belongs to
this kubelet instance: the instance takes a free ``10.X.0.0/16`` (the bridge is
``10.X.0.1``, where the DNS server and the API relay listen), node ``i`` gets
``10.X.i.0/24`` with its host IP ``10.X.i.1`` on the bridge, and its pods ``10.X.i.2-254``.
Pods on different nodes of one instance reach each other over the bridge.

Without root (no network namespaces), pods share the host network and get distinct
loopback addresses ``127.X.i.k`` instead: see :class:`LoopbackNetwork` for what degrades.

Everything an instance creates is named with ``ddk<id>`` (links) or ``ddk-<id>-`` (network
namespaces) and recorded under :func:`run_dir`, so a later start removes what a killed
instance left behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .paths import cache_dir

PREFIX = "ddk"
ID_ENV = "DDP_TEST_KUBELET_ID"  # in every pod process: leftovers are found by it
SUBNET_RANGE = range(100, 200)  # 10.X.0.0/16 candidates; clear of 10.96 and 10.244


def run_dir() -> Path:
    """Where instances register (``/run`` as root: it does not outlive a reboot)."""
    if os.geteuid() == 0:
        return Path("/run/ddp-test-kubelet")
    return cache_dir() / "run" / "test-kubelet"


def netns_supported() -> tuple[bool, str]:
    """Whether pods can get network namespaces here; the reason when not."""
    if os.geteuid() != 0:
        return False, "not running as root"
    if not shutil.which("ip"):
        return False, "the `ip` command (iproute2) is missing"
    try:
        r = subprocess.run(["unshare", "--net", "--mount", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"unshare failed: {e}"
    if r.returncode != 0:
        return False, f"unshare --net failed: {r.stderr.decode(errors='replace').strip()}"
    return True, ""


# -- pure ---------------------------------------------------------------------------------
def pick_subnet(taken: list[str], candidates: range = SUBNET_RANGE) -> int:
    """The first ``X`` whose ``10.X.0.0/16`` overlaps none of the ``taken`` networks."""
    nets = [ipaddress.ip_network(t, strict=False) for t in taken]
    for x in candidates:
        mine = ipaddress.ip_network(f"10.{x}.0.0/16")
        if not any(mine.overlaps(n) for n in nets if n.version == 4):
            return x
    raise RuntimeError("no free 10.X.0.0/16 for the pod network")


def allocate_ip(base: str, node_index: int, used: set[str]) -> str:
    """The lowest free pod address of node ``node_index`` (1-based) in ``base`` (``10.X``
    or ``127.X``): ``<base>.<node_index>.2`` .. ``.254``."""
    for host in range(2, 255):
        ip = f"{base}.{node_index}.{host}"
        if ip not in used:
            return ip
    raise RuntimeError(f"node {node_index} has no free pod address")


def stale_names(names: list[str], live_ids: set[str], kind: str) -> list[str]:
    """Which links (``kind='link'``) or namespaces (``'netns'``) belong to no live instance."""
    out = []
    for name in names:
        if kind == "netns" and name.startswith(f"{PREFIX}-"):
            owner = name.split("-")[1]
        elif kind == "link" and name.startswith(PREFIX) and len(name) >= len(PREFIX) + 6:
            owner = name[len(PREFIX) : len(PREFIX) + 6]
        else:
            continue
        if owner not in live_ids:
            out.append(name)
    return out


# -- I/O helpers --------------------------------------------------------------------------
def ip(*args: str, check: bool = True) -> str:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def processes_with_env(name: str, value: str | None = None) -> dict[int, str]:
    """Live processes whose environment sets ``name`` (to ``value`` when given): pid -> value."""
    prefix = f"{name}=".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        for item in env:
            if item.startswith(prefix) and state != "Z":
                v = item[len(prefix) :].decode(errors="replace")
                if value is None or v == value:
                    found[int(entry.name)] = v
    return found


def mounts_under(root: str) -> list[str]:
    """Mount points at or below ``root``, deepest first."""
    out = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].encode().decode("unicode_escape")
            if point == root or point.startswith(root.rstrip("/") + "/"):
                out.append(point)
    return sorted(out, key=len, reverse=True)


@contextlib.contextmanager
def _locked() -> Iterator[Path]:
    d = run_dir()
    d.mkdir(parents=True, exist_ok=True)
    with (d / "lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield d
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _live(record: dict[str, object]) -> bool:
    pid = int(str(record.get("pid", 0)))
    return pid > 0 and _start_time(pid) == record.get("start")


def cleanup_instance(instance: str, record: dict[str, object]) -> list[str]:
    """Remove every trace of ``instance``: processes, namespaces, links, mounts, mount
    points it created, and its registration. Returns what it removed, for the log."""
    done = []
    for pid in processes_with_env(ID_ENV, instance):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            done.append(f"process {pid}")
    if shutil.which("ip") and os.geteuid() == 0:
        namespaces = [line.split()[0] for line in ip("netns", "list", check=False).splitlines()]
        for ns in namespaces:
            if ns.startswith(f"{PREFIX}-{instance}-"):
                for pid_s in ip("netns", "pids", ns, check=False).split():
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid_s), signal.SIGKILL)
                ip("netns", "del", ns, check=False)
                done.append(f"netns {ns}")
        for name in _links():
            if name.startswith(f"{PREFIX}{instance}"):
                ip("link", "del", name, check=False)
                done.append(f"link {name}")
    state = str(record.get("state_dir") or "")
    if state and os.geteuid() == 0:
        for point in mounts_under(f"{state}/pods"):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
            done.append(f"mount {point}")
    d = run_dir()
    made = d / f"{instance}.mountpoints"
    heir = _live_instance(d, besides=instance)
    if made.exists() and heir is not None:
        # Every instance's pods mount on the same host paths (/checkpoints, /var/run/secrets/
        # ...), and removing a mount point detaches what is mounted on it in EVERY mount
        # namespace, so a live instance's pods would lose their volumes: hand them over.
        with (d / f"{heir}.mountpoints").open("a") as f:
            f.write(made.read_text())
        made.unlink()
        done.append(f"mount points handed over to the live instance {heir}")
    if made.exists():
        lines = made.read_text().splitlines()
        for line in reversed(lines):  # children before parents
            dev, ino, path = line.split(" ", 2)
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                if (st.st_dev, st.st_ino) == (int(dev), int(ino)):
                    (os.rmdir if Path(path).is_dir() else os.unlink)(path)
                    done.append(f"mount point {path}")
        made.unlink(missing_ok=True)
    (d / f"{instance}.json").unlink(missing_ok=True)
    return done


def _live_instance(d: Path, besides: str) -> str | None:
    """A live instance other than ``besides`` (the caller holds the lock)."""
    for reg in sorted(d.glob("*.json")):
        if reg.stem == besides:
            continue
        with contextlib.suppress(OSError, ValueError):
            if _live(json.loads(reg.read_text())):
                return reg.stem
    return None


def _links() -> list[str]:
    out = []
    for line in ip("-o", "link", "show", check=False).splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            out.append(parts[1].strip().split("@")[0])
    return out


def cleanup_stale() -> list[str]:
    """Remove what instances whose owner process is gone left behind."""
    with _locked() as d:
        return _cleanup_stale_locked(d)


def _cleanup_stale_locked(d: Path) -> list[str]:
    live: set[str] = set()
    removed: list[str] = []
    for reg in d.glob("*.json"):
        try:
            record = json.loads(reg.read_text())
        except (OSError, ValueError):
            record = {}
        if _live(record):
            live.add(reg.stem)
        else:
            removed += cleanup_instance(reg.stem, record)
    if shutil.which("ip") and os.geteuid() == 0:
        namespaces = [line.split()[0] for line in ip("netns", "list", check=False).splitlines()]
        for ns in stale_names(namespaces, live, "netns"):
            ip("netns", "del", ns, check=False)
            removed.append(f"netns {ns}")
        for name in stale_names(_links(), live, "link"):
            ip("link", "del", name, check=False)
            removed.append(f"link {name}")
    for pid, owner in processes_with_env(ID_ENV).items():
        if owner not in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                removed.append(f"process {pid}")
    return removed


# -- networks -----------------------------------------------------------------------------
@dataclass
class PodNet:
    ip: str
    host_ip: str
    netns: str | None = None  # path of the namespace file; None: the host network
    veth: str | None = None


@dataclass
class Network:
    """A bridge and one veth/netns pair per pod (needs root)."""

    nodes: list[str]
    state_dir: str
    instance: str = field(default_factory=lambda: secrets.token_hex(3))
    x: int = 0
    used: set[str] = field(default_factory=set)
    counter: int = 0
    isolated = True

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.instance}b"

    @property
    def gateway(self) -> str:
        return f"10.{self.x}.0.1"

    @property
    def mountpoints_file(self) -> Path:
        return run_dir() / f"{self.instance}.mountpoints"

    def host_ip(self, node: str) -> str:
        return f"10.{self.x}.{self.nodes.index(node) + 1}.1"

    def pod_cidr(self, node: str) -> str:
        return f"10.{self.x}.{self.nodes.index(node) + 1}.0/24"

    def setup(self) -> None:
        with _locked() as d:
            _cleanup_stale_locked(d)
            taken = [
                line.split()[0]
                for line in ip("-4", "route", "show", "table", "all").splitlines()
                if line.split() and line.split()[0] not in ("default", "local", "broadcast")
            ]
            taken += [
                line.split()[1]
                for line in ip("-4", "route", "show", "table", "local").splitlines()
                if len(line.split()) > 1
            ]
            for reg in d.glob("*.json"):
                with contextlib.suppress(OSError, ValueError, KeyError):
                    taken.append(f"10.{json.loads(reg.read_text())['x']}.0.0/16")
            self.x = pick_subnet(taken)
            record = {
                "pid": os.getpid(),
                "start": _start_time(os.getpid()),
                "state_dir": self.state_dir,
                "x": self.x,
                "nodes": self.nodes,
            }
            (d / f"{self.instance}.json").write_text(json.dumps(record))
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.gateway}/16", "dev", self.bridge)
        for node in self.nodes:
            ip("addr", "add", f"{self.host_ip(node)}/32", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")

    def add_pod(self, node: str) -> PodNet:
        pod_ip = allocate_ip(f"10.{self.x}", self.nodes.index(node) + 1, self.used)
        self.used.add(pod_ip)
        self.counter += 1
        n = f"{self.counter:x}"
        ns, host, peer = (
            f"{PREFIX}-{self.instance}-{n}",
            f"{PREFIX}{self.instance}p{n}",
            f"{PREFIX}{self.instance}c{n}",
        )
        try:
            ip("netns", "add", ns)
            ip("link", "add", host, "type", "veth", "peer", "name", peer)
            ip("link", "set", peer, "netns", ns)
            ip("link", "set", host, "master", self.bridge, "up")
            ip("-n", ns, "link", "set", peer, "name", "eth0")
            ip("-n", ns, "addr", "add", f"{pod_ip}/16", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "route", "add", "default", "via", self.gateway)
        except Exception:
            self.remove_pod(PodNet(pod_ip, self.host_ip(node), f"/run/netns/{ns}", host))
            raise
        return PodNet(pod_ip, self.host_ip(node), f"/run/netns/{ns}", host)

    def remove_pod(self, net: PodNet) -> None:
        if net.netns:
            name = Path(net.netns).name
            for pid_s in ip("netns", "pids", name, check=False).split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid_s), signal.SIGKILL)
            ip("netns", "del", name, check=False)
        if net.veth:
            ip("link", "del", net.veth, check=False)  # usually gone with its peer already
        self.used.discard(net.ip)

    def teardown(self) -> list[str]:
        with _locked():
            return cleanup_instance(self.instance, {"state_dir": self.state_dir})


@dataclass
class LoopbackNetwork:
    """The fallback without root: pods share the host network, each with its own loopback
    address ``127.X.i.k`` (services that bind ``0.0.0.0`` collide on ports); no mount, UTS
    or PID namespaces, so volumes are not at their mountPath, /etc/hosts and
    /etc/resolv.conf are the host's (cluster names do not resolve), the hostname is the
    host's, and in-cluster API config finds no token file."""

    nodes: list[str]
    state_dir: str
    instance: str = field(default_factory=lambda: secrets.token_hex(3))
    x: int = field(default_factory=lambda: 100 + secrets.randbelow(100))
    used: set[str] = field(default_factory=set)
    isolated = False

    @property
    def gateway(self) -> str:
        return "127.0.0.1"

    @property
    def mountpoints_file(self) -> Path:
        return run_dir() / f"{self.instance}.mountpoints"

    def host_ip(self, node: str) -> str:
        return f"127.{self.x}.{self.nodes.index(node) + 1}.1"

    def pod_cidr(self, node: str) -> str:
        return f"127.{self.x}.{self.nodes.index(node) + 1}.0/24"

    def setup(self) -> None:
        with _locked() as d:
            _cleanup_stale_locked(d)
            record = {"pid": os.getpid(), "start": _start_time(os.getpid()), "x": self.x}
            (d / f"{self.instance}.json").write_text(json.dumps(record))
        print(
            "WARNING: the test kubelet runs WITHOUT network namespaces (not root): pods share "
            "the host network on loopback addresses 127.X.Y.Z, volumes are not mounted at "
            "their mountPath, cluster DNS names and in-cluster API config do not work",
            file=sys.stderr,
            flush=True,
        )

    def add_pod(self, node: str) -> PodNet:
        pod_ip = allocate_ip(f"127.{self.x}", self.nodes.index(node) + 1, self.used)
        self.used.add(pod_ip)
        return PodNet(pod_ip, self.host_ip(node))

    def remove_pod(self, net: PodNet) -> None:
        self.used.discard(net.ip)

    def teardown(self) -> list[str]:
        with _locked():
            return cleanup_instance(self.instance, {})
