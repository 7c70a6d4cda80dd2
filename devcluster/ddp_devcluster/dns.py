"""Cluster DNS for the test kubelet's pods (development and tests only).

A small authoritative server for ``cluster.local``: A records only, NXDOMAIN for every name
it does not know (nothing is forwarded upstream: pods have no route out anyway). Records
are computed by the pure :func:`records` from Services and Pods and swapped in atomically;
the server threads only look names up.

- ``<svc>.<ns>.svc.cluster.local``: a headless Service resolves to the IPs of the pods its
  selector matches (ready ones, and not-ready ones too with ``publishNotReadyAddresses``);
  there is no kube-proxy, so a ClusterIP Service resolves the same way, to its pods.
- ``<hostname>.<subdomain>.<ns>.svc.cluster.local``: a pod with ``spec.hostname`` and
  ``spec.subdomain`` naming a headless Service that selects it.
- ``kubernetes.default.svc.cluster.local``: the address where the kubelet relays to the API
  server.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterable, Mapping
from typing import Any

CLUSTER_DOMAIN = "cluster.local"
QTYPE_A = 1
RCODE_OK, RCODE_FORMERR, RCODE_NXDOMAIN, RCODE_NOTIMP = 0, 1, 3, 4
TTL = 5


def _matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _ready(pod: Mapping[str, Any]) -> bool:
    for c in pod.get("status", {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return bool(c.get("status") == "True")
    return False


def _endpoint_pods(
    svc: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], ips: Mapping[str, str]
) -> list[tuple[Mapping[str, Any], str]]:
    spec = svc.get("spec", {})
    selector = spec.get("selector") or {}
    if not selector:
        return []  # endpoints managed by hand: not supported
    ns = svc["metadata"]["namespace"]
    include_not_ready = bool(spec.get("publishNotReadyAddresses"))
    out = []
    for pod in pods:
        meta = pod["metadata"]
        if meta.get("namespace") != ns or not _matches(selector, meta.get("labels") or {}):
            continue
        status = pod.get("status", {})
        if status.get("phase") in ("Succeeded", "Failed"):
            continue
        if meta.get("deletionTimestamp") and not include_not_ready:
            continue
        ip = ips.get(meta.get("uid", "")) or status.get("podIP")
        if ip and (include_not_ready or _ready(pod)):
            out.append((pod, ip))
    return out


def records(
    services: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    *,
    api_ip: str,
    local_ips: Mapping[str, str] | None = None,
    domain: str = CLUSTER_DOMAIN,
) -> dict[str, list[str]]:
    """Fully qualified lowercase name -> sorted A records.

    ``local_ips`` (pod uid -> IP) covers pods whose IP this kubelet assigned but has not
    written to the API yet, so a name resolves as soon as its pod has an address.
    """
    pods = list(pods)
    ips = local_ips or {}
    table: dict[str, set[str]] = {}
    for svc in services:
        meta = svc["metadata"]
        name, ns = meta["name"], meta["namespace"]
        fqdn = f"{name}.{ns}.svc.{domain}".lower()
        if (ns, name) == ("default", "kubernetes"):
            table.setdefault(fqdn, set()).add(api_ip)
            continue
        if svc.get("spec", {}).get("type") == "ExternalName":
            continue
        headless = svc.get("spec", {}).get("clusterIP") == "None"
        for pod, ip in _endpoint_pods(svc, pods, ips):
            table.setdefault(fqdn, set()).add(ip)
            pspec = pod.get("spec", {})
            if headless and pspec.get("hostname") and pspec.get("subdomain") == name:
                table.setdefault(f"{pspec['hostname']}.{fqdn}".lower(), set()).add(ip)
    return {k: sorted(v, key=socket.inet_aton) for k, v in table.items()}


def lookup(
    table: Mapping[str, list[str]], name: str, domain: str = CLUSTER_DOMAIN
) -> list[str] | None:
    """The A records of ``name`` (absolute, with or without the trailing dot), or None when
    the name does not exist. ``x.ns.svc`` is accepted as short for ``x.ns.svc.<domain>``."""
    n = name.lower().rstrip(".")
    if n.endswith(".svc"):
        n = f"{n}.{domain}"
    return table.get(n)


# -- wire format (RFC 1035), just enough for stub resolvers ---------------------------------
def parse_query(msg: bytes) -> tuple[int, int, str, int, int, bytes]:
    """(id, flags, qname, qtype, qclass, raw question) of a one-question query."""
    if len(msg) < 12:
        raise ValueError("short message")
    qid, flags, qdcount = struct.unpack("!HHH", msg[:6])
    if qdcount != 1:
        raise ValueError("exactly one question expected")
    labels, i = [], 12
    while True:
        if i >= len(msg):
            raise ValueError("truncated name")
        n = msg[i]
        if n == 0:
            i += 1
            break
        if n & 0xC0:
            raise ValueError("compressed question name")
        labels.append(msg[i + 1 : i + 1 + n].decode("ascii", errors="replace"))
        i += 1 + n
    if i + 4 > len(msg):
        raise ValueError("truncated question")
    qtype, qclass = struct.unpack("!HH", msg[i : i + 4])
    return qid, flags, ".".join(labels), qtype, qclass, msg[12 : i + 4]


def answer(query: bytes, table: Mapping[str, list[str]], max_size: int = 512) -> bytes:
    """The response to ``query``; sets TC (truncated) when the answers exceed ``max_size``."""
    try:
        qid, flags, qname, qtype, qclass, question = parse_query(query)
    except ValueError:
        qid = struct.unpack("!H", query[:2])[0] if len(query) >= 2 else 0
        return struct.pack("!HHHHHH", qid, 0x8000 | RCODE_FORMERR, 0, 0, 0, 0)
    rd = flags & 0x0100
    opcode = (flags >> 11) & 0xF
    if opcode != 0:
        return struct.pack("!HHHHHH", qid, 0x8000 | rd | RCODE_NOTIMP, 1, 0, 0, 0) + question
    ips = lookup(table, qname)
    rcode = RCODE_NXDOMAIN if ips is None else RCODE_OK
    answers = b""
    count = 0
    if ips and qtype in (QTYPE_A, 255) and qclass in (1, 255):
        for ip in ips:
            # name as a pointer to the question (offset 12), type A, class IN, TTL, 4 bytes
            answers += struct.pack("!HHHIH", 0xC00C, QTYPE_A, 1, TTL, 4) + socket.inet_aton(ip)
            count += 1
    aa = 0x0400
    head = struct.pack("!HHHHHH", qid, 0x8000 | aa | rd | 0x0080 | rcode, 1, count, 0, 0)
    out = head + question + answers
    if len(out) > max_size:
        head = struct.pack("!HHHHHH", qid, 0x8000 | aa | 0x0200 | rd | 0x0080 | rcode, 1, 0, 0, 0)
        return head + question
    return out


class DnsServer:
    """UDP and TCP on ``(host, 53)`` answering from a table that ``update`` replaces."""

    def __init__(self, host: str, port: int = 53) -> None:
        self.table: dict[str, list[str]] = {}
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.udp.bind((host, port))
        self.udp.settimeout(0.5)  # so the threads notice stop()
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.tcp.bind((host, port))
        self.tcp.listen(16)
        self.tcp.settimeout(0.5)
        self.stopped = threading.Event()
        self.threads = [
            threading.Thread(target=self._serve_udp, name="dns-udp", daemon=True),
            threading.Thread(target=self._serve_tcp, name="dns-tcp", daemon=True),
        ]

    def start(self) -> DnsServer:
        for t in self.threads:
            t.start()
        return self

    def update(self, table: dict[str, list[str]]) -> None:
        self.table = table  # one reference swap: readers see the old or the new table

    def _serve_udp(self) -> None:
        while not self.stopped.is_set():
            try:
                msg, peer = self.udp.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            with contextlib.suppress(OSError):
                self.udp.sendto(answer(msg, self.table), peer)

    def _serve_tcp(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.tcp.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._tcp_conn, args=(conn,), daemon=True).start()

    def _tcp_conn(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            try:
                while True:
                    head = _recv_exact(conn, 2)
                    if not head:
                        return
                    msg = _recv_exact(conn, struct.unpack("!H", head)[0])
                    out = answer(msg, self.table, max_size=65535)
                    conn.sendall(struct.pack("!H", len(out)) + out)
            except OSError:
                return

    def stop(self) -> None:
        self.stopped.set()
        for s in (self.udp, self.tcp):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            return b""
        buf += chunk
    return buf
