"""A DNS server that stops answering no longer fails a connect to a TCPStore, with the resolver
options the operator gives its pods (``render.RESOLVER_OPTIONS`` in ``RES_OPTIONS``).

torch's c10d looks up the name of each TCPStore peer's address (``getnameinfo``): the client
that of the store, the store's one server thread that of each client. On kind, powering off a
machine that ran one of the cluster's two DNS servers left its address in the DNS Service for
about 30 s; a lookup sent there failed after glibc's two 5 s tries, and a PerStep group's
connect to its primary group's store (a 5 s timeout, the group timeout) failed while that
store's server looked up another group's name: the survivors' next step came 11 to 21 s after
the power-off.

Here the store and its client are real processes on this machine, each in a mount namespace
whose ``/etc/resolv.conf`` names the test's DNS server (127.0.0.2:53). It answers "no such
name" until the store is up, then only listens, as a lost machine's DNS server does. The client
connects to the store at this machine's own address, which the client's ``/etc/hosts`` names
(as a pod's names its own IP) and the store's does not (as a pod's does not name its peers'):
only the store's lookups wait on DNS, as in the kind run. The store looked the client's address
up twice before it answered it (2026-11-29, torch 2.15): with glibc's own options (two 5 s tries
a lookup) the client's 5 s connect timed out; with the operator's (two 1 s tries) it connected
after 4.0 s. Needs root (port 53, ``unshare``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from trainer_harness import subprocess_env

from ddp_api.ddpjob import DDPJob
from ddp_devcluster.pytest_plugin import unavailable
from ddp_operator import render

DNS = "127.0.0.2"
CONNECT_TIMEOUT_S = 5  # a PerStep group's connect timeout: faultTolerance.groupTimeoutSeconds


SERVE = """
import time
from datetime import timedelta
import torch.distributed as dist
store = dist.TCPStore("0.0.0.0", 0, is_master=True, wait_for_workers=False,
                      timeout=timedelta(seconds=60))
print(store.port, flush=True)
time.sleep(600)  # until the test kills it
"""

CONNECT = """
import sys, time
from datetime import timedelta
import torch.distributed as dist
began = time.monotonic()
try:
    client = dist.TCPStore(sys.argv[1], int(sys.argv[2]), is_master=False,
                           wait_for_workers=False, timeout=timedelta(seconds=float(sys.argv[3])))
    client.set("k", "v")
    print(f"connected {time.monotonic() - began:.1f}", flush=True)
except Exception as error:
    print(f"failed {time.monotonic() - began:.1f}: {str(error).splitlines()[0]}", flush=True)
"""


@dataclass
class FakeDns:
    """A DNS server on 127.0.0.2:53 that answers every query with "no such name" until
    ``silent`` is set, then reads queries and answers none."""

    silent: threading.Event = field(default_factory=threading.Event)
    asked_while_silent: int = 0

    def serve(self, sock: socket.socket) -> None:
        while True:
            try:
                query, peer = sock.recvfrom(4096)
            except OSError:
                return
            if self.silent.is_set():
                self.asked_while_silent += 1
                continue
            # the id, flags (a response, recursion available, NXDOMAIN), the question again
            header = query[:2] + b"\x81\x83" + query[4:6] + b"\x00\x00\x00\x00\x00\x00"
            sock.sendto(header + query[12:], peer)


@pytest.fixture
def dns() -> Iterator[FakeDns]:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        unavailable("needs root and unshare (a port-53 DNS server, a resolv.conf per process)")
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((DNS, 53))
    server = FakeDns()
    threading.Thread(target=server.serve, args=(sock,), daemon=True).start()
    yield server
    sock.close()


def own_address() -> str:
    """This machine's first non-loopback IPv4 address (the one a peer's lookup would ask
    DNS for)."""
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True
    ).stdout
    for line in out.splitlines():
        return line.split()[3].split("/")[0]
    unavailable("no non-loopback IPv4 address on this machine")


def in_namespace(tmp: Path, hosts: str, program: str, *args: str) -> list[str]:
    """A command running ``python -c program args`` with its own /etc/resolv.conf (the fake
    DNS) and /etc/hosts (``hosts``)."""
    (tmp / "resolv.conf").write_text(f"nameserver {DNS}\n")
    (tmp / "hosts").write_text(f"127.0.0.1 localhost\n{hosts}")
    mounts = (
        f"mount --bind {tmp / 'resolv.conf'} /etc/resolv.conf && "
        f'mount --bind {tmp / "hosts"} /etc/hosts && exec "$@"'
    )
    return ["unshare", "-m", "sh", "-c", mounts, "sh", sys.executable, "-c", program, *args]


def store_connect(tmp: Path, dns: FakeDns, env: dict[str, str]) -> str:
    """Starts a store, silences DNS, connects to the store; the client's one line."""
    address = own_address()
    dns.silent.clear()
    (tmp / "server").mkdir(parents=True)
    (tmp / "client").mkdir()
    server = subprocess.Popen(
        in_namespace(tmp / "server", "", SERVE),
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        assert port.isdigit(), f"the store did not start: {port!r}"
        dns.silent.set()
        asked = dns.asked_while_silent
        client = subprocess.run(
            in_namespace(
                tmp / "client",
                f"{address} this-pod\n",
                CONNECT,
                address,
                port,
                str(CONNECT_TIMEOUT_S),
            ),
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        line = client.stdout.strip().splitlines()[-1] if client.stdout.strip() else client.stderr
        assert dns.asked_while_silent > asked, f"no name lookup reached DNS: {line}"
        return line
    finally:
        server.kill()  # it may still be looking a name up
        server.communicate(timeout=30)


def test_a_silent_dns_server_no_longer_fails_a_store_connect(tmp_path: Path, dns: FakeDns) -> None:
    job = DDPJob.model_validate(
        {
            "metadata": {"name": "j", "namespace": "ns", "uid": "u"},
            "spec": {"nodes": 2, "faultTolerance": {"mode": "PerStep"}},
        }
    )
    pod = render.render_worker(job, 0, 0, render.OperatorConfig())
    rendered = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    options = rendered["RES_OPTIONS"]
    assert options is not None

    without = subprocess_env()
    without.pop("RES_OPTIONS", None)
    failed = store_connect(tmp_path / "glibc", dns, without)
    print(f"glibc's own resolver options: {failed}")
    assert failed.startswith("failed"), f"the scene did not hold the store past 5 s: {failed}"

    connected = store_connect(tmp_path / "ours", dns, subprocess_env(RES_OPTIONS=options))
    print(f"RES_OPTIONS={options!r}: {connected}")
    assert connected.startswith("connected"), connected
