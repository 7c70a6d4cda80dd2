"""The operator against a real API server: pods driven by kwok (``kwok.ddp.dev/exit-code``).

The operator runs as its own process under the ServiceAccount and ClusterRole of
``manifests/rbac/operator.yaml``; the last test reads the API server's audit log to show that
it needed no more than that role, and used every verb of it.
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from ddp_devcluster.operator_process import OperatorProcess, install
from ddp_devcluster.plane import ControlPlane
from ddp_devcluster.polling import until

pytestmark = pytest.mark.controlplane
T = TypeVar("T")
EXIT = "kwok.ddp.dev/exit-code"
RBAC_FILE = Path(__file__).resolve().parents[2] / "manifests" / "rbac" / "operator.yaml"


@pytest.fixture(scope="module")
def operator(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    install(control_plane)
    op = OperatorProcess(
        control_plane,
        tmp_path_factory.mktemp("operator"),
        env={"DDP_BACKOFF_BASE_S": "1", "DDP_RESYNC_S": "2", "DDP_DEFAULT_IMAGE": "trainer:test"},
    )
    with op:
        yield op
    print(op.tail(30))


class Cluster:
    """kubectl in one fresh namespace, and polling helpers."""

    def __init__(self, cp: ControlPlane, op: OperatorProcess):
        self.cp, self.op = cp, op
        self.ns = f"t-{uuid.uuid4().hex[:8]}"
        cp.kubectl("create", "namespace", self.ns)

    def k(self, *args: str, check: bool = True, input: str | None = None) -> str:
        return str(self.cp.kubectl(*args, "-n", self.ns, check=check, input=input).stdout)

    def apply(self, name: str, spec: dict[str, Any]) -> None:
        body = {
            "apiVersion": "ddp.dev/v1alpha1",
            "kind": "DDPJob",
            "metadata": {"name": name},
            "spec": {"checkpoint": {"volume": {"emptyDir": {}}}, **spec},
        }
        self.k("apply", "-f", "-", input=yaml.safe_dump(body))

    def job(self, name: str) -> dict[str, Any]:
        out = self.k("get", "ddpjob", name, "-o", "json", check=False)
        return json.loads(out) if out else {}

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.job(name).get("status") or {})

    def pods(self, selector: str = "") -> dict[str, dict[str, Any]]:
        args = ["get", "pods", "-o", "json"] + (["-l", selector] if selector else [])
        return {p["metadata"]["name"]: p for p in json.loads(self.k(*args))["items"]}

    def workers(self, job: str) -> dict[str, dict[str, Any]]:
        return self.pods(f"ddp.dev/job-name={job},ddp.dev/role=worker")

    def exit(self, pod: str, code: int) -> None:
        """kwok ends the pod with this exit code (Succeeded for 0, else Failed)."""
        self.k("annotate", "pod", pod, f"{EXIT}={code}")

    def events(self, job: str) -> list[tuple[str, str, str]]:
        out = json.loads(
            self.k("get", "events", "-o", "json", "--field-selector", f"involvedObject.name={job}")
        )
        return [(e["type"], e["reason"], e["message"]) for e in out["items"]]

    def until(self, what: str, probe: Callable[[], T | None], timeout_s: float = 30) -> T:
        return until(what, probe, timeout_s, detail=lambda: "operator log:\n" + self.op.tail(15))

    def phase(self, job: str, phase: str, timeout_s: float = 30) -> dict[str, Any]:
        return self.until(
            f"{job} {phase}",
            lambda: ((s := self.status(job)).get("phase") == phase and s) or None,
            timeout_s,
        )

    def reason(self, job: str, reason: str, timeout_s: float = 30) -> dict[str, Any]:
        """Waits until ``status.reason`` (the reason of the phase's condition) is ``reason``."""
        return self.until(
            f"{job} saying {reason}",
            lambda: ((s := self.status(job)).get("reason") == reason and s) or None,
            timeout_s,
        )

    def running(self, job: str, nodes: int) -> dict[str, Any]:
        return self.until(
            f"{job} Running with {nodes} ready nodes",
            lambda: (
                (
                    (s := self.status(job)).get("phase") == "Running"
                    and s.get("readyNodes") == nodes
                    and len(self.workers(job)) == nodes
                    and s
                )
                or None
            ),
        )


@pytest.fixture
def c(control_plane: ControlPlane, operator: OperatorProcess) -> Cluster:
    return Cluster(control_plane, operator)


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {
        e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]
    }


def test_a_job_gets_its_services_store_and_one_restricted_pod_per_node(c: Cluster) -> None:
    c.apply("digits", {"nodes": 2, "nprocPerNode": 2, "trainer": {"workload": "digits"}})
    status = c.running("digits", 2)
    job = c.job("digits")
    uid = job["metadata"]["uid"]
    assert status["ready"] == "2/2" and status["selector"] == (
        "ddp.dev/job-name=digits,ddp.dev/role=worker"
    )
    assert status["observedGeneration"] == job["metadata"]["generation"]
    assert [x["type"] for x in status["conditions"] if x["status"] == "True"] == ["Running"]

    svc = json.loads(c.k("get", "service", "digits-rdzv", "-o", "json"))
    assert svc["spec"]["clusterIP"] not in ("", "None") and svc["spec"]["publishNotReadyAddresses"]
    assert svc["metadata"]["ownerReferences"][0]["uid"] == uid
    store = c.pods("ddp.dev/role=rdzv-store")
    assert list(store) == ["digits-rdzv"]

    workers = c.workers("digits")
    assert sorted(workers) == ["digits-node-0", "digits-node-1"]
    pod = workers["digits-node-1"]
    assert pod["metadata"]["labels"]["ddp.dev/node-index"] == "1"
    assert pod["metadata"]["ownerReferences"][0] == {
        "apiVersion": "ddp.dev/v1alpha1",
        "kind": "DDPJob",
        "name": "digits",
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    env = env_of(pod)
    assert env["PET_RDZV_ENDPOINT"] == f"digits-rdzv.{c.ns}.svc:29400"
    assert env["PET_RDZV_ID"] == uid
    assert env["PET_NNODES"] == "2:2" and env["PET_NPROC_PER_NODE"] == "2"
    assert "is_host=false" in env["PET_RDZV_CONF"]
    assert env["PET_LOCAL_ADDR"] == {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}
    assert json.loads(env["DDP_TRAINER_CONFIG"])["workload"] == "digits"
    spec = pod["spec"]
    ctr = spec["containers"][0]
    assert ctr["image"] == "trainer:test"
    assert ctr["securityContext"]["allowPrivilegeEscalation"] is False
    assert ctr["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    shm = next(v for v in spec["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in ctr["volumeMounts"]
    assert spec["serviceAccountName"] == "ddp-trainer"

    # `kubectl get ddpj` shows the phase and ready/desired nodes.
    table = c.k("get", "ddpj", "digits")
    assert table.split("\n")[0].split()[:3] == ["NAME", "PHASE", "READY"]
    assert table.split("\n")[1].split()[:3] == ["digits", "Running", "2/2"]
    assert any(r == "CreatingPods" for _, r, _ in c.events("digits"))

    # The trainer's ServiceAccount may patch the job's status, and nothing else.
    who = f"--as=system:serviceaccount:{c.ns}:ddp-trainer"
    can = c.k("auth", "can-i", "patch", "ddpjobs.ddp.dev", "--subresource=status", who)
    assert can.strip() == "yes"
    for verb, what in (("patch", "ddpjobs.ddp.dev"), ("get", "pods"), ("get", "secrets")):
        assert c.k("auth", "can-i", verb, what, who, check=False).strip() == "no"


def test_user_overrides_and_own_command_are_merged_into_the_pods(c: Cluster) -> None:
    c.apply(
        "own",
        {
            "nodes": 1,
            "command": ["torchrun", "/scripts/train.py"],
            "args": ["--lr", "0.1"],
            "resources": {"limits": {"cpu": 1, "memory": "1Gi"}},
            "template": {
                "metadata": {"labels": {"team": "vision"}},
                "nodeSelector": {"type": "kwok"},
                "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "env": [{"name": "EXTRA", "value": "1"}],
                "volumes": [{"name": "scripts", "emptyDir": {}}],
                "volumeMounts": [{"name": "scripts", "mountPath": "/scripts"}],
            },
        },
    )
    pod = c.until("the pod", lambda: c.workers("own").get("own-node-0"))
    ctr = pod["spec"]["containers"][0]
    assert ctr["command"] == ["torchrun", "/scripts/train.py"] and ctr["args"] == ["--lr", "0.1"]
    assert ctr["resources"]["limits"] == {"cpu": "1", "memory": "1Gi"}
    assert pod["metadata"]["labels"]["team"] == "vision"
    assert pod["spec"]["nodeSelector"] == {"type": "kwok"}
    assert pod["spec"]["tolerations"][0]["key"] == "gpu"
    assert env_of(pod)["EXTRA"] == "1" and "DDP_TRAINER_CONFIG" not in env_of(pod)
    assert {"name": "scripts", "mountPath": "/scripts"} in ctr["volumeMounts"]


def test_scale_up_adds_and_scale_down_removes_the_highest_indices(c: Cluster) -> None:
    c.apply("elastic", {"nodes": 2, "minNodes": 1, "maxNodes": 4})
    c.running("elastic", 2)
    first = {n: p["metadata"]["uid"] for n, p in c.workers("elastic").items()}
    c.k("scale", "ddpjob/elastic", "--replicas", "3")
    c.running("elastic", 3)
    assert sorted(c.workers("elastic")) == ["elastic-node-0", "elastic-node-1", "elastic-node-2"]
    c.k("scale", "ddpjob/elastic", "--replicas", "1")
    c.until("scale-down to node 0", lambda: list(c.workers("elastic")) == ["elastic-node-0"])
    assert c.workers("elastic")["elastic-node-0"]["metadata"]["uid"] == first["elastic-node-0"]
    status = c.running("elastic", 1)
    assert status["restarts"] == 0  # removing nodes is no failure
    assert any(r == "ScalingDown" for _, r, _ in c.events("elastic"))
    refused = c.cp.kubectl("scale", "ddpjob/elastic", "--replicas", "5", "-n", c.ns, check=False)
    assert refused.returncode != 0 and "spec.nodes (5) must be within" in refused.stderr


def test_a_failed_pod_is_recreated_and_counted(c: Cluster) -> None:
    c.apply("flaky", {"nodes": 2})
    c.running("flaky", 2)
    old = c.workers("flaky")["flaky-node-1"]["metadata"]["uid"]
    c.exit("flaky-node-1", 137)
    c.until(
        "a new flaky-node-1",
        lambda: (p := c.workers("flaky").get("flaky-node-1")) and p["metadata"]["uid"] != old,
    )
    status = c.running("flaky", 2)
    assert status["restarts"] == 1
    pod = c.workers("flaky")["flaky-node-1"]
    assert pod["metadata"]["annotations"]["ddp.dev/attempt"] == "1"
    assert any(
        t == "Warning" and r == "PodFailed" and "exit code 137" in m
        for t, r, m in c.events("flaky")
    )


def test_a_pod_deleted_by_someone_else_is_recreated_and_counted(c: Cluster) -> None:
    c.apply("lost", {"nodes": 2})
    c.running("lost", 2)
    old = c.workers("lost")["lost-node-0"]["metadata"]["uid"]
    c.k("delete", "pod", "lost-node-0", "--wait=false")
    c.until(
        "a new lost-node-0",
        lambda: (p := c.workers("lost").get("lost-node-0")) and p["metadata"]["uid"] != old,
    )
    assert c.running("lost", 2)["restarts"] == 1
    assert any(r == "PodDisrupted" for _, r, _ in c.events("lost"))


def test_the_job_fails_when_its_restart_budget_is_spent(c: Cluster) -> None:
    c.apply("budget", {"nodes": 2, "backoffLimit": 1})
    c.running("budget", 2)
    c.exit("budget-node-0", 1)
    c.until("restart 1", lambda: c.status("budget").get("restarts") == 1)
    c.running("budget", 2)
    c.exit("budget-node-0", 1)
    status = c.phase("budget", "Failed")
    failed = next(x for x in status["conditions"] if x["type"] == "Failed")
    assert failed["status"] == "True" and failed["reason"] == "BackoffLimitExceeded"
    assert status["completionTime"]
    c.until("the store and running pods deleted", lambda: "budget-rdzv" not in c.pods() or None)
    assert any(r == "BackoffLimitExceeded" for _, r, _ in c.events("budget"))


def test_exit_code_policy_fails_at_once_on_a_program_error(c: Cluster) -> None:
    c.apply("strict", {"nodes": 2, "restartPolicy": "ExitCode", "backoffLimit": 5})
    c.running("strict", 2)
    c.exit("strict-node-1", 2)
    status = c.phase("strict", "Failed")
    failed = next(x for x in status["conditions"] if x["type"] == "Failed")
    assert failed["reason"] == "PodFailed" and "exit code 2" in failed["message"]
    assert status["restarts"] == 0


def test_the_job_succeeds_when_every_node_exits_zero(c: Cluster) -> None:
    c.apply("done", {"nodes": 2})
    c.running("done", 2)
    c.exit("done-node-0", 0)
    c.exit("done-node-1", 0)
    status = c.phase("done", "Succeeded")
    assert status["completionTime"] and status["restarts"] == 0
    c.until("the store deleted", lambda: "done-rdzv" not in c.pods() or None)
    phases = {n: p["status"]["phase"] for n, p in c.workers("done").items()}
    assert phases == {"done-node-0": "Succeeded", "done-node-1": "Succeeded"}  # kept for logs
    assert c.k("get", "ddpj", "done").split("\n")[1].split()[1] == "Succeeded"


def test_suspend_deletes_the_pods_and_resume_recreates_them(c: Cluster) -> None:
    c.apply("pause", {"nodes": 2})
    c.running("pause", 2)
    c.k("patch", "ddpjob", "pause", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    c.phase("pause", "Suspended")
    c.until("no pods", lambda: not c.pods("ddp.dev/job-name=pause") or None)
    c.k("patch", "ddpjob", "pause", "--type=merge", "-p", '{"spec":{"suspend":false}}')
    status = c.running("pause", 2)
    assert status["restarts"] == 0
    reasons = [r for _, r, _ in c.events("pause")]
    assert "Suspended" in reasons and "Resumed" in reasons


def test_active_deadline_fails_the_job(c: Cluster) -> None:
    c.apply("slow", {"nodes": 1, "activeDeadlineSeconds": 3})
    status = c.phase("slow", "Failed", timeout_s=20)
    failed = next(x for x in status["conditions"] if x["type"] == "Failed")
    assert failed["reason"] == "DeadlineExceeded"
    c.until("pods stopped", lambda: not c.workers("slow") or None)


def test_a_finished_job_is_deleted_after_its_ttl_with_its_pods(c: Cluster) -> None:
    c.apply("brief", {"nodes": 1, "ttlSecondsAfterFinished": 2})
    c.running("brief", 1)
    c.exit("brief-node-0", 0)
    c.phase("brief", "Succeeded")
    c.until("the job deleted", lambda: not c.job("brief") or None, timeout_s=30)
    c.until("its pods collected", lambda: not c.pods("ddp.dev/job-name=brief") or None)


def test_deleting_a_job_garbage_collects_its_pods_and_services(c: Cluster) -> None:
    c.apply("gone", {"nodes": 2})
    c.running("gone", 2)
    c.k("delete", "ddpjob", "gone")
    c.until("pods collected", lambda: not c.pods("ddp.dev/job-name=gone") or None)
    c.until(
        "services collected",
        lambda: (
            not json.loads(c.k("get", "svc", "-l", "ddp.dev/job-name=gone", "-o", "json"))["items"]
            or None
        ),
    )


def test_an_operator_killed_mid_creation_converges_without_duplicates(
    c: Cluster, operator: OperatorProcess
) -> None:
    """A ResourceQuota holds the creation half-way; the operator dies there and restarts."""
    nodes, room = 16, 6
    c.k("create", "quota", "pods", f"--hard=pods={room}")
    c.until("quota usage known", lambda: "pods" in c.k("get", "quota", "pods", "-o", "json"))
    c.until(
        "quota usage known",
        lambda: json.loads(c.k("get", "quota", "pods", "-o", "json")).get("status", {}).get("used"),
    )
    c.apply("big", {"nodes": nodes, "minNodes": 1, "maxNodes": nodes})
    c.until(
        "creation held by the quota",
        lambda: any(r == "CreateFailed" and "quota" in m for _, r, m in c.events("big")),
    )
    operator.kill()
    before = {n: p["metadata"]["uid"] for n, p in c.pods("ddp.dev/job-name=big").items()}
    assert len(before) == room
    c.k("delete", "quota", "pods")
    operator.start()
    status = c.running("big", nodes)
    after = {n: p["metadata"]["uid"] for n, p in c.pods("ddp.dev/job-name=big").items()}
    assert sorted(after) == sorted([*(f"big-node-{i}" for i in range(nodes)), "big-rdzv"])
    assert all(after[n] == uid for n, uid in before.items())  # none recreated or duplicated
    assert status["restarts"] == 0


def _condition(status: dict[str, Any]) -> dict[str, Any]:
    """The condition of the job's phase; ``status.reason`` is its reason."""
    cond = next(x for x in status["conditions"] if x["type"] == status["phase"])
    assert cond["status"] == "True" and status["reason"] == cond["reason"]
    return dict(cond)


def test_a_job_that_cannot_start_says_why_and_what_cannot_heal_fails(c: Cluster) -> None:
    """Pod statuses as a kubelet and the scheduler write them: the scheduler's own for a
    missing claim; a kubelet's, patched in (kwok plays only Running and the end), for an
    image that cannot be pulled and a command that does not exist."""
    nowhere = {"volume": {"persistentVolumeClaim": {"claimName": "nope"}}}
    c.apply("noclaim", {"nodes": 2, "startupDeadlineSeconds": 10, "checkpoint": nowhere})
    c.apply("noimage", {"nodes": 1})
    c.apply("nocmd", {"nodes": 1, "command": ["/no/such/binary"]})
    c.running("noimage", 1)
    c.running("nocmd", 1)

    def kubelet(pod: str, phase: str, state: dict[str, Any]) -> None:
        ready = "True" if phase == "Running" else "False"
        patch = {
            "status": {
                "phase": phase,
                "conditions": [{"type": "Ready", "status": ready}],
                "containerStatuses": [
                    {"name": "trainer", "image": "trainer:test", "imageID": "", "ready": False,
                     "restartCount": 0, "state": state},
                ],
            }
        }  # fmt: skip
        c.k("patch", "pod", pod, "--subresource=status", "--type=merge", "-p", json.dumps(patch))

    back_off = 'Back-off pulling image "trainer:test": ErrImagePull: not found'
    kubelet(
        "noimage-node-0",
        "Pending",
        {"waiting": {"reason": "ImagePullBackOff", "message": back_off}},
    )
    no_binary = 'exec: "/no/such/binary": stat /no/such/binary: no such file or directory'
    ended = {"reason": "StartError", "exitCode": 128, "message": no_binary}
    kubelet("nocmd-node-0", "Failed", {"terminated": ended})

    # A missing command cannot heal: Failed at once, naming it, no restart spent.
    failed = _condition(c.phase("nocmd", "Failed"))
    assert failed["reason"] == "CommandNotFound"
    assert "nocmd-node-0 cannot run /no/such/binary: exec:" in failed["message"]
    assert c.status("nocmd")["restarts"] == 0

    # An image that cannot be pulled: said within the minute, once; it heals when it pulls.
    pull = c.reason("noimage", "ImagePullFailed")
    cond = _condition(pull)
    assert pull["phase"] == "Running"  # it was; the reason says what goes wrong now
    assert f"noimage-node-0 cannot pull image trainer:test: {back_off}" in cond["message"]
    assert "startupDeadlineSeconds" in cond["message"]
    kubelet("noimage-node-0", "Running", {"running": {"startedAt": "2026-01-01T00:00:00Z"}})
    c.reason("noimage", "AllNodesRunning")
    assert [r for _, r, _ in c.events("noimage")].count("ImagePullFailed") == 1

    # A missing claim: pods Pending as the scheduler leaves them; Failed past the deadline.
    waiting = c.reason("noclaim", "ClaimNotFound")
    assert waiting["phase"] == "Pending"
    said = _condition(waiting)["message"]
    assert (
        "noclaim-node-0 and noclaim-node-1 cannot be scheduled: persistentvolumeclaim 'nope'"
        in said
    )
    header, row = c.k("get", "ddpj", "noclaim").splitlines()[:2]
    assert dict(zip(header.split(), row.split(), strict=False))["REASON"] == "ClaimNotFound"
    failed = _condition(c.phase("noclaim", "Failed", timeout_s=30))
    assert failed["reason"] == "ClaimNotFound"
    assert "lasted past spec.startupDeadlineSeconds (10s)" in failed["message"]
    c.until("its pods removed", lambda: not c.pods("ddp.dev/job-name=noclaim") or None)
    assert [r for _, r, _ in c.events("noclaim")].count("ClaimNotFound") == 2  # said, failed


def scrape(op: OperatorProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The operator's /metrics, parsed by Prometheus' own text parser: (sample, labels) -> value."""
    with urllib.request.urlopen(op.metrics_url, timeout=5) as r:
        text = r.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        assert family.documentation, f"{family.name} has no help text"
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_metrics_show_the_jobs_by_phase_and_what_the_operator_did(c: Cluster) -> None:
    before = scrape(c.op)

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return scrape(c.op).get(key, 0.0) - before.get(key, 0.0)

    c.apply("metered", {"nodes": 2})
    c.running("metered", 2)
    running = ("ddp_operator_jobs", (("namespace", c.ns), ("phase", "Running")))
    assert scrape(c.op)[running] == 1
    # Rank 0 reports its first step, as the trainer does.
    c.k(
        "patch", "ddpjob", "metered", "--subresource=status", "--type=merge",
        "-p", '{"status":{"progress":{"step":1,"totalSteps":10}}}',
    )  # fmt: skip
    c.until("the first step timed", lambda: delta("ddp_operator_job_first_step_seconds_count"))
    c.k("delete", "pod", "metered-node-1")
    c.until("a restart", lambda: c.status("metered").get("restarts") == 1 or None)
    c.running("metered", 2)
    c.exit("metered-node-0", 0)
    c.exit("metered-node-1", 0)
    c.phase("metered", "Succeeded")
    after = scrape(c.op)
    assert after[("ddp_operator_jobs", (("namespace", c.ns), ("phase", "Succeeded")))] == 1
    assert after[running] == 0  # the other phases of a namespace stay, at 0
    assert delta("ddp_operator_restarts_total", reason="PodDisrupted") == 1
    assert delta("ddp_operator_pod_creates_total") >= 4  # the store, 2 nodes, 1 recreated
    assert delta("ddp_operator_pod_deletes_total") >= 1  # the store, once the job ended
    assert delta("ddp_operator_job_pods_created_seconds_count") == 1
    assert delta("ddp_operator_job_first_step_seconds_count") == 1
    assert delta("ddp_operator_reconcile_duration_seconds_count") >= 3
    assert ("ddp_operator_workqueue_depth", ()) in after
    assert all(
        set(dict(labels)) <= {"namespace", "phase", "reason", "code", "le"} for _, labels in after
    )


def _rbac_rules() -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) of the operator's ClusterRole in manifests/."""
    docs = list(yaml.safe_load_all(RBAC_FILE.read_text()))
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    return {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def test_the_operator_used_exactly_the_rbac_in_manifests(
    c: Cluster, operator: OperatorProcess
) -> None:
    """Runs last in this module: by now every scenario above has exercised the operator."""
    user = "system:serviceaccount:ddp-system:ddp-operator"
    used: set[tuple[str, str, str]] = set()
    refused: list[str] = []
    for line in c.cp.audit_log.read_text().splitlines():
        record = json.loads(line)
        if record.get("user", {}).get("username") != user or "objectRef" not in record:
            continue
        ref = record["objectRef"]
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        verb = record["verb"]
        # RBAC's own refusals (a ResourceQuota's 403s are allowed by RBAC, then refused).
        if record.get("annotations", {}).get("authorization.k8s.io/decision") == "forbid":
            refused.append(f"{verb} {resource}")
        used.add((ref.get("apiGroup", ""), resource, verb))
    assert not refused, f"the operator was refused: {sorted(set(refused))}"
    granted = _rbac_rules()
    assert used <= granted
    assert granted - used == set(), "rules in manifests/rbac/operator.yaml that nothing used"
