"""DDPJobs queued by real Kueue (built at its pin, running against the embedded plane), with
kwok ending pods by annotation (``kwok.ddp.dev/exit-code``).

The operator runs as its own chart release, ``ddp-kueue``, rendered with ``kueue.enabled=true``:
its own ServiceAccount and ClusterRole, so the last test can hold the operator to exactly the
rules that value adds, apart from the default release that tests/controlplane/test_operator.py
checks.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kwok_harness import KwokNamespace

from ddp_devcluster.kueue import API, METRICS_CERTS, KueueProcess, operator_rbac, queue_objects
from ddp_devcluster.operator_process import NAMESPACE, OperatorProcess, install
from ddp_devcluster.plane import ControlPlane, role_rules
from ddp_devcluster.pytest_plugin import unavailable

pytestmark = pytest.mark.controlplane
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
RELEASE = "ddp-kueue"
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "manifests" / "examples" / "kueue").glob("*.yaml"))


def chart_rbac() -> list[dict[str, Any]]:
    """The ServiceAccount and RBAC of release ddp-kueue with kueue.enabled=true."""
    return operator_rbac(RELEASE, NAMESPACE)


@pytest.fixture(scope="module")
def kueue(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KueueProcess]:
    if os.geteuid() != 0 and not (METRICS_CERTS / "tls.crt").is_file():
        unavailable(f"Kueue reads a certificate at {METRICS_CERTS}: run as root (kueue.py)")
    install(control_plane)  # the DDPJob CRD first: Kueue registers it as an external framework
    k = KueueProcess(control_plane, tmp_path_factory.mktemp("kueue"))
    with k:
        print(f"\n[kueue] ready in {k.startup_s:.1f}s")
        yield k
    print(k.tail(30))


@pytest.fixture(scope="module")
def operator(
    control_plane: ControlPlane, kueue: KueueProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    for doc in chart_rbac():
        control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
    op = OperatorProcess(
        control_plane,
        tmp_path_factory.mktemp("operator"),
        env={
            "DDP_KUEUE": "true",
            "DDP_RESYNC_S": "2",
            "DDP_DEFAULT_IMAGE": "trainer:test",
            "DDP_TRAINER_POLICY": f"{RELEASE}-trainer-progress",  # as the chart sets it
            "DDP_LEASE_NAME": RELEASE,  # the release's Lease, as its chart names it
        },
        service_account=RELEASE,
    )
    with op:
        yield op
    print(op.tail(30))
    # Its cluster-wide objects go with it: the admission policy of a second release would
    # also judge the pods of the tests after this module (and name itself in their refusals).
    for doc in chart_rbac():
        control_plane.kubectl(
            "delete", "--ignore-not-found", "-f", "-", input=yaml.safe_dump(doc), check=False
        )


class Queues(KwokNamespace):
    """One namespace, a ResourceFlavor, a ClusterQueue with quota for ``cpu`` CPUs and a
    LocalQueue ``lq`` in front of it."""

    timeout_s = 60

    def __init__(self, cp: ControlPlane, op: OperatorProcess, kueue: KueueProcess, cpu: int):
        super().__init__(cp, op, "q")
        self.kueue = kueue
        self.id = self.ns.removeprefix("q-")
        self.flavor, self.cq = f"f-{self.id}", f"cq-{self.id}"
        quota: dict[str, int | str] = {"cpu": cpu, "memory": "64Gi"}
        self.apply(*queue_objects(self.ns, "lq", self.cq, self.flavor, quota, {"type": "kwok"}))

    def create(self, obj: dict[str, Any]) -> None:
        self.apply({"apiVersion": API, **obj})

    def queue(self, name: str, cpu: str = "1", labels: dict[str, str] | None = None, **spec: Any):
        """A DDPJob of two nodes of ``cpu`` CPUs each unless ``spec`` says, in LocalQueue lq."""
        resources = {"requests": {"cpu": cpu, "memory": "1Gi"}}
        self.submit(
            name,
            {"nodes": 2, "resources": resources, **spec},
            {QUEUE_LABEL: "lq", **(labels or {})},
        )

    def worker_names(self, job: str, live: bool = True) -> list[str]:
        """The job's node pods, without those being deleted unless ``live`` is False."""
        return sorted(
            n
            for n, p in self.workers(job).items()
            if not live or not p["metadata"].get("deletionTimestamp")
        )

    def workloads(self, job: str) -> list[dict[str, Any]]:
        of_job = f"ddp.dev/job-name={job}"
        return list(self.get("workloads.kueue.x-k8s.io", "-l", of_job, check=True)["items"])

    def diagnostics(self, ns: str | None = None) -> str:
        workloads = self.k("get", "workloads", "-o", "wide", ns=ns, check=False)
        return f"{super().diagnostics(ns)}\nkueue log:\n{self.kueue.tail(10)}\n{workloads}"


@pytest.fixture
def q2(control_plane: ControlPlane, operator: OperatorProcess, kueue: KueueProcess) -> Queues:
    """A ClusterQueue with quota for 2 one-CPU nodes."""
    return Queues(control_plane, operator, kueue, cpu=2)


def condition(status: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == ctype), {})


def test_kueue_admits_a_hand_made_workload(q2: Queues) -> None:
    """The smoke test of Kueue itself: flavor, ClusterQueue, LocalQueue, a Workload."""
    q2.create(
        {
            "kind": "Workload",
            "metadata": {"name": "by-hand", "namespace": q2.ns},
            "spec": {
                "queueName": "lq",
                "podSets": [
                    {
                        "name": "main",
                        "count": 1,
                        "template": {
                            "spec": {
                                "restartPolicy": "Never",
                                "containers": [
                                    {
                                        "name": "c",
                                        "image": "x",
                                        "resources": {"requests": {"cpu": "1"}},
                                    }
                                ],
                            }
                        },
                    }
                ],
            },
        }
    )
    wl = q2.until(
        "the Workload Admitted",
        lambda: (
            (
                (w := json.loads(q2.k("get", "workloads.kueue.x-k8s.io", "by-hand", "-o", "json")))
                and any(
                    c["type"] == "Admitted" and c["status"] == "True"
                    for c in w.get("status", {}).get("conditions", [])
                )
                and w
            )
            or None
        ),
    )
    assert wl["status"]["admission"]["clusterQueue"] == q2.cq
    q2.k("delete", "workloads.kueue.x-k8s.io", "by-hand")


def test_the_second_job_waits_queued_without_pods_until_the_first_succeeds(q2: Queues) -> None:
    q2.queue("first")
    q2.running("first", 2)
    first = q2.status("first")
    assert (first["queue"], first["clusterQueue"], first["admissions"]) == ("lq", q2.cq, 1)
    assert first["admittedNodes"] == 2
    assert condition(first, "Admitted")["status"] == "True"
    admitted = [e for e in q2.events("first") if e[1] == "Admitted"]
    assert admitted and q2.cq in admitted[0][2]
    # The flavor's node labels are in the pods.
    pod = json.loads(q2.k("get", "pod", "first-node-0", "-o", "json"))
    assert pod["spec"]["nodeSelector"]["type"] == "kwok"
    (wl,) = q2.workloads("first")
    (ps,) = wl["spec"]["podSets"]
    assert (ps["name"], ps["count"]) == ("node", 2)
    assert ps["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "1"
    owner = wl["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("DDPJob", "first", True)

    q2.queue("second")
    second = q2.phase("second", "Queued")
    assert second["queue"] == "lq" and "clusterQueue" not in second
    assert "admittedNodes" not in second
    wide = q2.k("get", "ddpj", "second", "-o", "wide")
    assert "Queued" in wide and "lq" in wide
    assert q2.worker_names("second") == []
    assert q2.k("get", "pod", "second-rdzv", check=False) == ""

    q2.succeed("first")
    q2.until(
        "the first job's Workload Finished",
        lambda: any(
            c["type"] == "Finished" and c["status"] == "True"
            for c in q2.workloads("first")[0]["status"]["conditions"]
        ),
    )
    q2.running("second", 2)
    assert q2.status("second")["clusterQueue"] == q2.cq
    q2.succeed("second")


def test_a_job_too_big_for_every_flavor_stays_queued_with_kueues_message(q2: Queues) -> None:
    q2.queue("huge", cpu="50")
    q2.until("Kueue's verdict on the Workload", lambda: _reserved_message(q2, "huge"))
    status = q2.phase("huge", "Queued")
    kueue_says = _reserved_message(q2, "huge")
    assert kueue_says and kueue_says in condition(status, "Admitted")["message"]
    assert kueue_says in condition(status, "Queued")["message"]
    assert status["phase"] != "Failed" and q2.worker_names("huge") == []


def _reserved_message(q: Queues, job: str) -> str | None:
    for wl in q.workloads(job):
        for c in wl.get("status", {}).get("conditions", []):
            if c["type"] == "QuotaReserved" and c["status"] == "False" and c.get("message"):
                return str(c["message"])
    return None


def test_deleting_a_queued_job_deletes_its_workload_and_a_restart_makes_no_duplicate(
    q2: Queues, operator: OperatorProcess
) -> None:
    q2.queue("holder")
    q2.running("holder", 2)
    q2.queue("waiting-a")
    q2.queue("waiting-b")
    q2.phase("waiting-a", "Queued")
    q2.phase("waiting-b", "Queued")
    assert len(q2.workloads("waiting-a")) == 1

    operator.kill()
    operator.start()
    q2.queue("waiting-c")  # a reconcile after the restart has certainly happened
    q2.phase("waiting-c", "Queued")
    for job in ("holder", "waiting-a", "waiting-b", "waiting-c"):
        assert len(q2.workloads(job)) == 1, job

    q2.k("delete", "ddpjob", "waiting-a")
    q2.until("waiting-a's Workload gone", lambda: q2.workloads("waiting-a") == [])
    q2.succeed("holder")
    q2.running("waiting-b", 2)
    assert len(q2.workloads("waiting-b")) == 1


def test_a_high_priority_job_preempts_a_low_one_which_is_readmitted_after(
    q2: Queues, control_plane: ControlPlane
) -> None:
    for name, value in (("ddp-low", 100), ("ddp-high", 1000)):
        control_plane.kubectl("create", "priorityclass", name, f"--value={value}", check=False)
    q2.queue("low", template={"priorityClassName": "ddp-low"})
    q2.running("low", 2)
    assert q2.workloads("low")[0]["spec"]["priority"] == 100
    q2.queue("high", template={"priorityClassName": "ddp-high"})

    evicted = q2.until(
        "low evicted",
        lambda: [e for e in q2.events("low") if e[1] == "Evicted"] or None,
    )
    assert evicted[0][0] == "Warning" and "Preempted" in evicted[0][2]
    status = q2.phase("low", "Queued")
    assert condition(status, "Queued")["reason"] == "Preempted"
    assert status.get("restarts", 0) == 0
    q2.running("high", 2)
    assert q2.worker_names("low", live=False) == []
    q2.succeed("high")
    q2.running("low", 2)
    low = q2.status("low")
    assert low["admissions"] == 2
    assert "Readmitted" in [e[1] for e in q2.events("low")]
    q2.succeed("low")


def test_an_elastic_job_is_admitted_partially_and_follows_scale_while_queued(q2: Queues) -> None:
    """Supported elasticity: the Workload asks for spec.nodes with minCount minNodes; Kueue's
    partial admission may admit fewer, and the job runs that many. While queued, `kubectl
    scale` changes the Workload's count; once admitted it runs at most the admitted count."""
    q2.queue("wide", nodes=3, minNodes=1, maxNodes=4)
    status = q2.running("wide", 2)
    assert status["nodes"] == 2 and len(q2.worker_names("wide")) == 2
    assert status["admittedNodes"] == 2  # Kueue's count, beside spec.nodes 3
    (wl,) = q2.workloads("wide")
    assert (wl["spec"]["podSets"][0]["count"], wl["spec"]["podSets"][0]["minCount"]) == (3, 1)
    assert wl["status"]["admission"]["podSetAssignments"][0]["count"] == 2
    # Admitted for 2: scaling up stays at 2 (no quota for more), scaling down removes pods.
    q2.k("scale", "ddpjob", "wide", "--replicas=4")
    generation = json.loads(q2.k("get", "ddpjob", "wide", "-o", "json"))["metadata"]["generation"]
    q2.until(
        "the scale seen by the operator",
        lambda: q2.status("wide").get("observedGeneration") == generation,
    )
    assert q2.worker_names("wide") == ["wide-node-0", "wide-node-1"]
    q2.k("scale", "ddpjob", "wide", "--replicas=1")
    q2.until("wide down to 1 node", lambda: q2.worker_names("wide") == ["wide-node-0"])
    shrunk = q2.running("wide", 1)
    assert shrunk["admittedNodes"] == 2  # still admitted for 2; it runs spec.nodes 1

    q2.queue("later", nodes=2, minNodes=1, maxNodes=4)
    q2.phase("later", "Queued")
    q2.k("scale", "ddpjob", "later", "--replicas=1")
    q2.until(
        "the queued Workload scaled to 1",
        lambda: q2.workloads("later")[0]["spec"]["podSets"][0]["count"] == 1,
    )
    q2.succeed("wide")
    q2.running("later", 1)
    q2.succeed("later")


def test_suspending_an_admitted_job_gives_its_quota_back_until_it_is_resumed(q2: Queues) -> None:
    q2.queue("pausing")
    q2.running("pausing", 2)
    q2.queue("next")
    q2.phase("next", "Queued")
    q2.k("patch", "ddpjob", "pausing", "--type=merge", "-p", '{"spec": {"suspend": true}}')
    q2.phase("pausing", "Suspended")
    q2.running("next", 2)  # the suspended job's Workload is inactive: its quota went to next
    assert q2.workloads("pausing")[0]["spec"]["active"] is False
    assert "clusterQueue" not in q2.status("pausing")
    q2.k("patch", "ddpjob", "pausing", "--type=merge", "-p", '{"spec": {"suspend": false}}')
    q2.phase("pausing", "Queued")
    q2.succeed("next")
    q2.running("pausing", 2)
    assert q2.status("pausing")["admissions"] == 2
    q2.succeed("pausing")


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_the_kueue_examples_pass_a_server_side_dry_run(
    control_plane: ControlPlane, kueue: KueueProcess, example: Path
) -> None:
    out = control_plane.kubectl(
        "apply", "--dry-run=server", "--server-side", "-n", "default", "-f", str(example)
    ).stdout
    assert "serverside-applied (server dry run)" in out, out


def test_the_operator_used_exactly_the_rbac_of_the_kueue_value(
    q2: Queues, operator: OperatorProcess
) -> None:
    """Runs last in this module: every rule kueue.enabled adds was used, and no more."""
    used, refused = q2.cp.requests_of(f"system:serviceaccount:{NAMESPACE}:{RELEASE}")
    assert not refused, f"the operator was refused: {sorted(set(refused))}"
    # The release's own ClusterRole, and the Role of its Lease (leader election).
    lease_role = f"{RELEASE}-leader-election"
    granted = {
        rule
        for d in chart_rbac()
        if (d["kind"], d["metadata"]["name"]) in (("ClusterRole", RELEASE), ("Role", lease_role))
        for rule in role_rules(d)
    }
    kueue_rules = {x for x in granted if x[0] in ("kueue.x-k8s.io", "scheduling.k8s.io")}
    assert used <= granted
    assert kueue_rules - used == set(), "rules of kueue.enabled that nothing used"
