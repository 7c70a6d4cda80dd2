"""Two operator replicas against a real API server: the one that holds the Lease acts, the other
stands by with warm caches and takes over when the Lease is not renewed.

Each replica is its own process with its own identity (``OperatorProcess.identity``, which its
requests carry in their User-Agent), so the API server's audit log says which replica sent
what, and when it received it: the tests read "no two writers" and "no pod created twice" from
there, not from either operator's own account. Leases are short here (6 s, renew deadline 4 s,
read or renewed every 0.5 s) so that a takeover takes seconds. The last test cuts a leader off
at a chosen write of the operator's own plan execution, as a lost leader would be.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kopf
import pytest
from kwok_harness import KwokNamespace

from ddp_api.contract import API_VERSION, KIND, PLURAL
from ddp_api.ddpjob import EventType, Reason
from ddp_api.status import StatusFields
from ddp_devcluster.operator_process import NAMESPACE, SERVICE_ACCOUNT, OperatorProcess, install
from ddp_devcluster.plane import ControlPlane
from ddp_devcluster.polling import until
from ddp_devcluster.prometheus import scrape
from ddp_operator import informer, kube, render
from ddp_operator.actions import Actions
from ddp_operator.metrics import OperatorMetrics
from ddp_operator.planner import views
from ddp_operator.planner.draft import Plan
from ddp_operator.trainer_objects import TrainerObjects

pytestmark = pytest.mark.controlplane
LEASE_S, RENEW_DEADLINE_S, RETRY_S = 6.0, 4.0, 0.5
RECONCILE_S = 5.0  # a reconcile after the takeover, on a busy two-core machine
ENV = {
    "DDP_DEFAULT_IMAGE": "trainer:test",
    "DDP_BACKOFF_BASE_S": "1",
    "DDP_LEASE_DURATION_S": str(LEASE_S),
    "DDP_RENEW_DEADLINE_S": str(RENEW_DEADLINE_S),
    "DDP_RETRY_PERIOD_S": str(RETRY_S),
}
LEASE = "ddp-operator"  # the chart's default, and the one name its Role lets it get and update
WRITES = ("create", "update", "patch", "delete", "deletecollection")


@dataclass(frozen=True)
class Request:
    """One request as the API server's audit log recorded it."""

    at: dt.datetime  # requestReceivedTimestamp: the server's clock
    agent: str
    verb: str
    resource: str
    name: str
    code: int

    @property
    def write(self) -> bool:
        return self.verb in WRITES

    def by(self, op: OperatorProcess) -> bool:
        return self.agent.endswith(f"/{op.identity}")


def requests(cp: ControlPlane, since: dt.datetime) -> list[Request]:
    out = []
    for line in cp.audit_log.read_text().splitlines():
        r = json.loads(line)
        ref = r.get("objectRef") or {}
        at = dt.datetime.fromisoformat(r["requestReceivedTimestamp"].replace("Z", "+00:00"))
        if at < since or "ddp-operator/" not in r.get("userAgent", ""):
            continue
        out.append(
            Request(
                at, r["userAgent"], r["verb"], ref.get("resource", ""), ref.get("name", ""),
                int((r.get("responseStatus") or {}).get("code") or 0),
            )
        )  # fmt: skip
    return sorted(out, key=lambda r: r.at)


def holder(cp: ControlPlane) -> str:
    out = cp.kubectl("get", "lease", LEASE, "-n", NAMESPACE, "-o", "json", check=False).stdout
    return str(json.loads(out).get("spec", {}).get("holderIdentity") or "") if out else ""


def leads(op: OperatorProcess) -> float:
    """The replica's own ``ddp_operator_leader`` gauge."""
    return scrape(op.metrics_url).get(("ddp_operator_leader", ()), -1.0)


@pytest.fixture
def replicas(
    control_plane: ControlPlane, tmp_path: Path
) -> Iterator[Callable[..., OperatorProcess]]:
    """Starts replicas on demand (the first one is the leader once it says so); stops them."""
    install(control_plane)
    # No Lease left by an earlier test's operator (killed, or stopped): ours start afresh.
    control_plane.kubectl("delete", "lease", LEASE, "-n", NAMESPACE, "--ignore-not-found")
    started: list[OperatorProcess] = []

    def start(name: str, account: str = SERVICE_ACCOUNT) -> OperatorProcess:
        op = OperatorProcess(control_plane, tmp_path / name, dict(ENV), service_account=account)
        started.append(op.start())
        return op

    yield start
    for op in started:
        op.stop()
        print(f"--- {op.identity}\n{op.tail(15)}")


def one_leads(cp: ControlPlane, leader: OperatorProcess, standby: OperatorProcess) -> None:
    until(f"{leader.identity} leads", lambda: holder(cp) == leader.identity and leads(leader) == 1)
    until(f"{standby.identity} stands by", lambda: leads(standby) == 0 or None)
    until(  # a warm standby: its pod and Service caches are filled
        f"{standby.identity}'s caches filled",
        lambda: "pods and Services of all namespaces listed" in standby.tail(200) or None,
    )


def leader_and_job(
    cp: ControlPlane,
    replicas: Callable[..., OperatorProcess],
    prefix: str,
    job: str,
    account: str = SERVICE_ACCOUNT,
) -> tuple[OperatorProcess, OperatorProcess, KwokNamespace, str]:
    """Replica a (as ``account``) leads and b stands by; ``job`` runs on 2 nodes in a fresh
    namespace named after ``prefix``: (a, b, that namespace, the uid of the job's node 1)."""
    a = replicas("a", account)
    until("a leads", lambda: holder(cp) == a.identity or None)
    b = replicas("b")
    one_leads(cp, a, b)
    c = KwokNamespace(cp, a, prefix)
    c.submit(job, {"nodes": 2})
    c.running(job, 2)
    return a, b, c, c.workers(job)[f"{job}-node-1"]["metadata"]["uid"]


def assert_one_writer_at_a_time(
    log: list[Request], first: OperatorProcess, then: OperatorProcess
) -> None:
    """Every write of ``first`` (the Lease's aside) was received before any of ``then``."""
    jobs = [r for r in log if r.write and r.resource != "leases"]
    mine = [r.at for r in jobs if r.by(first)]
    theirs = [r.at for r in jobs if r.by(then)]
    assert mine and theirs, (len(mine), len(theirs))
    assert max(mine) < min(theirs), (max(mine), min(theirs))


def lease_writes(log: list[Request], op: OperatorProcess) -> list[Request]:
    return [r for r in log if r.by(op) and r.resource == "leases" and r.write]


def pods_created(log: list[Request]) -> Counter[str]:
    return Counter(
        r.name for r in log if r.resource == "pods" and r.verb == "create" and r.code == 201
    )


def test_a_killed_leader_s_standby_acts_within_the_lease_a_stopped_one_s_at_once(
    control_plane: ControlPlane, replicas: Callable[..., OperatorProcess]
) -> None:
    """SIGKILL (a crash, a lost machine): the Lease is taken once it has not been renewed for
    its duration. SIGTERM (a rolling update): it is released, and taken at the next read. In
    both, the old leader's writes all precede the new one's, and no pod is created twice."""
    cp = control_plane
    since = dt.datetime.now(dt.UTC)
    a, b, c, uid = leader_and_job(cp, replicas, "leader", "warm")

    killed = time.monotonic()
    a.kill()  # SIGKILL: no cleanup, the Lease stays a's until it is not renewed for 6 s
    c.k("delete", "pod", "warm-node-1", "--wait=false")
    c.replaced("warm", "warm-node-1", uid, "warm-node-1 replaced", LEASE_S + 30)
    took = time.monotonic() - killed
    print(f"\nleader SIGKILLed -> the standby's replacement pod: {took:.1f}s "
          f"(lease {LEASE_S:g}s, read every {RETRY_S:g}s)")  # fmt: skip
    assert took < LEASE_S + RETRY_S + RECONCILE_S
    assert holder(cp) == b.identity and leads(b) == 1
    c.running("warm", 2)

    log = requests(cp, since)
    assert_one_writer_at_a_time(log, a, b)
    created = pods_created(log)
    assert {n: created[n] for n in ("warm-rdzv", "warm-node-0", "warm-node-1")} == {
        "warm-rdzv": 1, "warm-node-0": 1, "warm-node-1": 2,  # its replacement, once
    }  # fmt: skip
    second = [r for r in log if r.name == "warm-node-1" and r.verb == "create" and r.code == 201]
    assert second[-1].by(b)

    # The first replica comes back (same identity, as a restarted container): it stands by.
    # Then the leader is stopped gracefully (a rolling update): it releases the Lease, and
    # the standby takes it at its next read instead of after the lease.
    a.start()
    one_leads(cp, b, a)
    since = dt.datetime.now(dt.UTC)
    stopping = time.monotonic()
    b.stop()
    until("a leads again", lambda: holder(cp) == a.identity and leads(a) == 1, LEASE_S)
    took = time.monotonic() - stopping
    print(f"leader stopped gracefully -> the standby leads: {took:.1f}s")
    assert took < LEASE_S  # released, not expired
    uid = c.workers("warm")["warm-node-0"]["metadata"]["uid"]
    c.k("delete", "pod", "warm-node-0", "--wait=false")
    c.replaced("warm", "warm-node-0", uid, "warm-node-0 replaced by a")
    log = [r for r in requests(cp, since) if r.write and r.resource != "leases"]
    before, after = [r.at for r in log if r.by(b)], [r.at for r in log if r.by(a)]
    assert after and (not before or max(before) < min(after)), (before, after)


def test_a_leader_whose_renewals_are_refused_stops_before_its_standby_takes_over(
    control_plane: ControlPlane, replicas: Callable[..., OperatorProcess]
) -> None:
    """The partition: the leader keeps its connection, its watches and every permission but
    one, that to renew its Lease (its RoleBinding to the Lease's Role is deleted). It stops
    acting at its renew deadline on its own; the standby takes over a lease later."""
    cp = control_plane
    account = f"ddp-operator-cut-{uuid.uuid4().hex[:6]}"
    cp.kubectl("create", "serviceaccount", account, "-n", NAMESPACE)
    cp.kubectl("create", "clusterrolebinding", account, "--clusterrole=ddp-operator",
               f"--serviceaccount={NAMESPACE}:{account}")  # fmt: skip
    cp.kubectl("create", "rolebinding", account, "-n", NAMESPACE,
               "--role=ddp-operator-leader-election",
               f"--serviceaccount={NAMESPACE}:{account}")  # fmt: skip
    try:
        since = dt.datetime.now(dt.UTC)
        a, b, c, uid = leader_and_job(cp, replicas, "partition", "cut", account)

        cut = time.monotonic()
        cp.kubectl("delete", "rolebinding", account, "-n", NAMESPACE)
        until("a stops acting", lambda: leads(a) == 0 or None, RENEW_DEADLINE_S + 10)
        stopped = time.monotonic() - cut
        print(f"\nrenewals refused -> the leader stopped acting after {stopped:.1f}s "
              f"(renew deadline {RENEW_DEADLINE_S:g}s)")  # fmt: skip
        assert stopped < RENEW_DEADLINE_S + 2 * RETRY_S + 1  # its last renewal was before the cut
        assert "stopped acting: Lease" in a.tail(300)
        c.k("delete", "pod", "cut-node-1", "--wait=false")
        c.replaced("cut", "cut-node-1", uid, "cut-node-1 replaced", LEASE_S + 30)
        print(f"renewals refused -> the standby's replacement pod: {time.monotonic() - cut:.1f}s")
        assert holder(cp) == b.identity and leads(a) == 0 and leads(b) == 1
        c.running("cut", 2)

        log = requests(cp, since)
        assert_one_writer_at_a_time(log, a, b)
        renewals = [r.at for r in lease_writes(log, a) if r.code in (200, 201)]
        taken = min(r.at for r in lease_writes(log, b) if r.code in (200, 201))
        # Nothing received past a's renew deadline (0.2 s: a request's way over loopback), and
        # nothing at all once b took the Lease: the server's clock, not the operators'.
        deadline = max(renewals) + dt.timedelta(seconds=RENEW_DEADLINE_S + 0.2)
        sent = [r.at for r in log if r.by(a) and r.write and r.resource != "leases"]
        assert max(sent) < min(deadline, taken), (max(sent), deadline, taken)
        assert any(r.code == 403 for r in lease_writes(log, a))  # it went on trying to renew
        assert pods_created(log)["cut-node-1"] == 2
        second = [r for r in log if r.name == "cut-node-1" and r.verb == "create" and r.code == 201]
        assert second[-1].by(b)
    finally:
        cp.kubectl("delete", "clusterrolebinding", account, "--ignore-not-found")
        cp.kubectl("delete", "rolebinding", account, "-n", NAMESPACE, "--ignore-not-found")
        cp.kubectl("delete", "serviceaccount", account, "-n", NAMESPACE, "--ignore-not-found")


def as_operator(cp: ControlPlane) -> kopf.ConnectionInfo:
    """The operator's RBAC installed, and a login as its ServiceAccount, for an API client
    made in the test."""
    install(cp)
    token = cp.kubectl("create", "token", SERVICE_ACCOUNT, "-n", NAMESPACE).stdout.strip()
    return kopf.ConnectionInfo(server=cp.server, ca_path=str(cp.ca_file), token=token)


def test_the_api_client_sends_no_write_while_its_gate_is_closed(
    control_plane: ControlPlane,
) -> None:
    """The choke point itself: a write through :class:`kube.Kube` with its gate closed raises
    and never reaches the server; a read goes through."""
    cp = control_plane
    info = as_operator(cp)
    agent = f"ddp-operator/gate-{uuid.uuid4().hex[:6]}"
    since = dt.datetime.now(dt.UTC)

    async def run() -> int:
        api = kube.Kube(lambda: info, 4, may_write=lambda: False, user_agent=agent)
        try:
            r = await api.call("GET", kube.core_path(NAMESPACE, "pods"))
            config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "never", "namespace": NAMESPACE}}  # fmt: skip
            with pytest.raises(kube.NotLeading):
                await api.call("POST", kube.path_of(config_map), config_map)
            assert api.writes_in_flight == 0
            return r.status
        finally:
            await api.close()

    assert asyncio.run(run()) == 200
    seen = until(
        "the read in the audit log",
        lambda: [r for r in requests(cp, since) if r.agent == agent] or None,
    )
    assert [(r.verb, r.resource) for r in seen] == [("list", "pods")]


@dataclass(frozen=True)
class Seen:
    """What the API server holds of a job and its lost pod."""

    told: int  # Disruption Events about the job
    counted: bool  # status.handledFailures is the pod's uid, once
    pod_left: bool  # the pod is still there


class WritesGate:
    """A leader's gate that closes after its ``writes``-th write: the moment a replica is lost
    mid-reconcile, chosen exactly (the gate is asked right before each write is sent)."""

    def __init__(self, writes: int) -> None:
        self.left = writes

    def __call__(self) -> bool:
        self.left -= 1
        return self.left >= 0


def test_a_leader_lost_mid_reconcile_leaves_a_counted_failure_told_exactly_once(
    control_plane: ControlPlane,
) -> None:
    """The operator's own plan execution (``Actions.run``, as the operator's ServiceAccount)
    of a reconcile that counts a lost pod, cut off at a chosen write: after its Event, before
    the status (its successor counts the failure again and posts the same Event name: the API
    server answers AlreadyExists), and after the status, before the pods. Each time the job
    ends with the failure counted once and one Event about it."""
    cp = control_plane
    info = as_operator(cp)
    ns = f"told-{uuid.uuid4().hex[:6]}"
    cp.kubectl("create", "namespace", ns)

    def scene(job: str) -> tuple[Callable[[Callable[[], bool]], None], Callable[[], Seen]]:
        """A job whose node 1 a reconcile counts as lost: (that reconcile, under a gate; what
        the API server holds)."""
        cp.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps({
            "apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": job},
            "spec": {"checkpoint": {"volume": {"emptyDir": {}}}},
        }))  # fmt: skip
        pod = f"{job}-node-1"
        cp.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "labels": {render.LABEL_JOB: job}},
            "spec": {"nodeSelector": {"ddp.dev/nowhere": "true"},  # stays Pending
                     "containers": [{"name": "c", "image": "none"}]},
        }))  # fmt: skip
        uid = json.loads(cp.kubectl("get", "pod", pod, "-n", ns, "-o", "json").stdout)["metadata"][
            "uid"
        ]

        def job_now() -> dict[str, Any]:
            out = cp.kubectl("get", PLURAL, job, "-n", ns, "-o", "json").stdout
            return dict(json.loads(out))

        def counting(status: StatusFields) -> Plan:
            """What a reconcile plans for the lost pod, from the status it reads."""
            p = Plan(delete=[pod])
            if uid not in (status.get("handledFailures") or []):
                p.status = {"handledFailures": [uid], "disruptions": 1}
                p.events.append(
                    (EventType.NORMAL, Reason.DISRUPTION, f"{pod} was deleted; recreating it")
                )
            return p

        async def reconcile(gate: Callable[[], bool]) -> None:
            api = kube.Kube(lambda: info, 4, may_write=gate)
            trainer = TrainerObjects(
                informer.Cache(render.LABEL_JOB, views.view), api, asyncio.ensure_future
            )
            try:
                body = job_now()
                status = StatusFields(**(body.get("status") or {}))
                await Actions(OperatorMetrics(), trainer, api).run(
                    body, None, status, counting(status)
                )
            finally:
                await api.close()

        def seen() -> Seen:
            events = json.loads(cp.kubectl(
                "get", "events", "-n", ns, "--field-selector", f"involvedObject.name={job}",
                "-o", "json",
            ).stdout)["items"]  # fmt: skip
            present = cp.kubectl("get", "pod", pod, "-n", ns, "--ignore-not-found", "-o", "name")
            return Seen(
                told=sum(1 for e in events if e["reason"] == Reason.DISRUPTION),
                counted=(job_now().get("status") or {}).get("handledFailures") == [uid],
                pod_left=bool(present.stdout.strip()),
            )

        return lambda gate: asyncio.run(reconcile(gate)), seen

    # Lost after the Event, before the status: its successor counts the failure again and
    # posts the same Event name, which the API server refuses.
    run, seen = scene("after-event")
    with pytest.raises(kube.NotLeading):
        run(WritesGate(1))
    assert seen() == Seen(told=1, counted=False, pod_left=True)
    run(lambda: True)
    assert seen() == Seen(told=1, counted=True, pod_left=False)
    # Lost after the status, before the pods: the Event went before the status.
    run, seen = scene("after-status")
    with pytest.raises(kube.NotLeading):
        run(WritesGate(2))
    assert seen() == Seen(told=1, counted=True, pod_left=True)
