"""The Helm chart and the manifests generated from it (no cluster: see
tests/controlplane/test_shipping.py for the API server's verdict)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_api.contract import PROGRESS_ANNOTATION
from ddp_devcluster.plane import binary
from ddp_operator.crd import crd_yaml
from ddp_operator.progress_policy import binding_in_force, policy_in_force
from ddp_operator.render import (
    DEFAULT_TRAINER_POLICY,
    LABEL_JOB,
    LABEL_ROLE,
    PROGRESS_ACCOUNT,
    ROLE_WORKER,
    OperatorConfig,
    render_namespace_trainer,
)
from ddp_operator.reports import MAX_RECORD_CHARS

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "ddp-operator"


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(binary("helm")), *args], capture_output=True, text=True)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def render(*values: str) -> list[dict[str, Any]]:
    out = helm("template", "ddp-operator", str(CHART), "-n", "ddp-system", *values).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def one(docs: list[dict[str, Any]], kind: str, name: str = "") -> dict[str, Any]:
    (found,) = [
        d for d in docs if d["kind"] == kind and (not name or d["metadata"]["name"] == name)
    ]
    return found


@pytest.mark.parametrize(
    "values",
    [[], ["--set", "watchNamespaces={team-a,team-b}", "--set", "logLevel=debug"]],
    ids=["defaults", "watched-namespaces"],
)
def test_helm_lint_strict(values: list[str]) -> None:
    helm("lint", "--strict", str(CHART), *values)


def test_manifests_are_what_the_chart_renders() -> None:
    """manifests/rbac and manifests/operator, and the chart's crds/, are generated: no drift."""
    proc = subprocess.run(
        [sys.executable, str(CHART.parent / "render_manifests.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, f"run `make manifests`:\n{proc.stdout}{proc.stderr}"


def test_the_chart_carries_the_generated_crd() -> None:
    assert (CHART / "crds" / "ddp.dev_ddpjobs.yaml").read_text() == crd_yaml()


def test_defaults_watch_all_namespaces_with_a_cluster_role_binding() -> None:
    docs = render()
    assert sorted(d["kind"] for d in docs) == [
        "ClusterRole",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "PodDisruptionBudget",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == "ddp-operator"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "ddp-operator", "namespace": "ddp-system"}
    ]
    deploy = one(docs, "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "ddp-operator"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["containers"]
    assert c["image"] == "ghcr.io/ddp-operator/operator:0.1.0"
    assert c["args"] == ["--all-namespaces"]
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    env = {e["name"]: e.get("value") for e in c["env"]}
    # The chart's default trainer image is the operator's own default.
    assert env["DDP_DEFAULT_IMAGE"] == OperatorConfig.default_image
    assert env["DDP_RESYNC_S"] == "30" and env["DDP_BACKOFF_BASE_S"] == "10"
    # The probes ask kopf's liveness endpoint, on the port the image's ENTRYPOINT serves.
    assert c["ports"] == [
        {"name": "health", "containerPort": 8080},
        {"name": "metrics", "containerPort": 8081},
    ]
    assert env["DDP_METRICS_PORT"] == "8081"
    service = one(docs, "Service")
    assert service["metadata"]["name"] == "ddp-operator-metrics"
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8081, "targetPort": "metrics"}]
    assert (
        service["spec"]["selector"].items()
        <= deploy["spec"]["template"]["metadata"]["labels"].items()
    )
    assert "--liveness=http://0.0.0.0:8080/healthz" in (REPO / "Dockerfile").read_text()
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert set(c["resources"]) == {"requests", "limits"}


def test_watched_namespaces_bind_the_role_in_those_namespaces_only() -> None:
    docs = render(
        "--set", "watchNamespaces={team-a,team-b}", "--set", "logLevel=verbose",
        "--set", "trainerImage=registry.local/trainer:1",
    )  # fmt: skip
    assert not [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    bindings = [d for d in docs if d["kind"] == "RoleBinding" and d["roleRef"]["kind"] != "Role"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    assert {b["roleRef"]["kind"] for b in bindings} == {"ClusterRole"}
    # The Lease's Role stays bound in the release's own namespace.
    assert one(docs, "Role")["metadata"]["namespace"] == "ddp-system"
    (c,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert c["args"] == ["--namespace=team-a", "--namespace=team-b", "--verbose"]
    assert {e["name"]: e.get("value") for e in c["env"]}["DDP_DEFAULT_IMAGE"] == (
        "registry.local/trainer:1"
    )


def test_monitors_are_behind_values_and_select_what_serves_metrics() -> None:
    docs = render(
        "--set", "metrics.serviceMonitor.enabled=true",
        "--set", "metrics.serviceMonitor.labels.release=prom",
        "--set", "metrics.podMonitor.enabled=true",
        "--set", "watchNamespaces={team-a}",
    )  # fmt: skip
    sm, pm = one(docs, "ServiceMonitor"), one(docs, "PodMonitor")
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert (
        sm["spec"]["selector"]["matchLabels"].items()
        <= one(docs, "Service")["metadata"]["labels"].items()
    )
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    # The trainer pods: node pods that declare the port `metrics` (render/worker.py), in the watched
    # namespaces.
    assert pm["spec"]["selector"]["matchLabels"] == {LABEL_ROLE: ROLE_WORKER}
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["team-a"]}
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert pm["spec"]["podTargetLabels"] == [LABEL_JOB]
    off = render("--set", "metrics.port=0")
    assert not [d for d in off if d["kind"] == "Service"]
    (c,) = one(off, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [p["name"] for p in c["ports"]] == ["health"]


@pytest.mark.parametrize(
    "bad",
    [
        "logLevel=loud",
        "watchNamespaces={Not_A_Namespace}",
        "settings.workers=0",
        "replicas=0",
        "leaderElection.leaseDurationSeconds=0",
        "metrics.port=70000",
        "metrics.podMonitor.interval=often",
    ],
)
def test_the_values_schema_refuses(bad: str) -> None:
    proc = helm("template", "x", str(CHART), "--set", bad, check=False)
    assert proc.returncode != 0 and "values don't meet the specifications" in proc.stderr, (
        proc.stderr
    )


def test_the_operator_leaves_a_lost_machine_in_30_s_not_300() -> None:
    def tolerations(*values: str) -> list[dict[str, Any]]:
        spec = one(render(*values), "Deployment")["spec"]["template"]["spec"]
        return list(spec.get("tolerations", []))

    ours = {t["key"]: t for t in tolerations()}
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        assert ours[key] == {
            "key": key,
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 30,
        }
    assert tolerations("--set", "lostMachineTolerationSeconds=0") == []
    mine = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    both = tolerations("--set-json", f"tolerations=[{json.dumps(mine)}]")
    assert both[-1] == mine and len(both) == 3


def test_two_replicas_on_two_machines_elect_one_through_a_lease() -> None:
    """The defaults: two replicas, spread over machines, one of them always up through a
    drain; the Lease, its RBAC (get and update of that Lease only) and its settings."""
    docs = render()
    deploy = one(docs, "Deployment")
    assert deploy["spec"]["replicas"] == 2
    assert deploy["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = deploy["spec"]["template"]["spec"]
    labels = deploy["spec"]["selector"]["matchLabels"]
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname" and spread["maxSkew"] == 1
    assert spread["labelSelector"]["matchLabels"] == labels
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": labels}}
    (c,) = pod["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
    assert env["DDP_LEADER_ELECTION"] == "true"
    assert env["DDP_LEASE_NAME"] == "ddp-operator" and env["DDP_LEASE_NAMESPACE"] == "ddp-system"
    assert env["DDP_LEADER_IDENTITY"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert (env["DDP_LEASE_DURATION_S"], env["DDP_RENEW_DEADLINE_S"]) == ("15", "10")
    assert env["DDP_RETRY_PERIOD_S"] == "2"
    role, binding = one(docs, "Role"), one(docs, "RoleBinding")
    assert role["metadata"]["namespace"] == "ddp-system"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["ddp-operator"],
            "verbs": ["get", "update"],
        },
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == one(docs, "ClusterRoleBinding")["subjects"]

    named = render("--set", "leaderElection.leaseName=ops-lease")
    assert one(named, "Role")["rules"][1]["resourceNames"] == ["ops-lease"]
    single = render("--set", "replicas=1", "--set", "leaderElection.enabled=false")
    assert {d["kind"] for d in single} & {"PodDisruptionBudget", "Role", "RoleBinding"} == set()
    deploy = one(single, "Deployment")
    assert deploy["spec"]["strategy"] == {"type": "Recreate"}
    assert "topologySpreadConstraints" not in deploy["spec"]["template"]["spec"]
    (c,) = deploy["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["DDP_LEADER_ELECTION"] == "false" and "DDP_LEASE_NAME" not in env
    for bad, why in (
        (["--set", "leaderElection.enabled=false"], "replicas > 1 needs leaderElection"),
        (["--set", "leaderElection.renewDeadlineSeconds=15"], "shorter than leaseDuration"),
        (["--set", "leaderElection.retryPeriodSeconds=10"], "shorter than renewDeadline"),
    ):
        proc = helm("template", "x", str(CHART), *bad, check=False)
        assert proc.returncode != 0 and why in proc.stderr, proc.stderr


def test_the_trainers_policy_speaks_the_operators_names_and_fails_closed() -> None:
    """The chart's ClusterRole, policy and binding for the namespaces' trainer account, and
    what the operator renders and reads, agree (names, the annotation, the record's bound)."""
    for values in ([], ["--set", "watchNamespaces={team-a}"]):
        docs = render(*values)
        name = DEFAULT_TRAINER_POLICY  # the release ddp-operator's, as in manifests/
        role = one(docs, "ClusterRole", name)
        assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}]
        policy = one(docs, "ValidatingAdmissionPolicy", name)
        assert policy["spec"]["failurePolicy"] == "Fail"
        (who,) = policy["spec"]["matchConditions"]
        assert f"':{PROGRESS_ACCOUNT}'" in who["expression"]
        rules = yaml.safe_dump(policy["spec"]["validations"], width=1000)
        assert f"'{PROGRESS_ANNOTATION}'" in rules and f"<= {MAX_RECORD_CHARS}" in rules
        binding = one(docs, "ValidatingAdmissionPolicyBinding", name)
        assert binding["spec"] == {"policyName": name, "validationActions": ["Deny"]}
        assert policy_in_force(policy) and binding_in_force(binding)  # as the operator sees them
        # The operator may grant that one ClusterRole (bind) and read the policy, not patch pods.
        operator = one(docs, "ClusterRole", "ddp-operator")["rules"]
        bind = {
            "apiGroups": ["rbac.authorization.k8s.io"],
            "resources": ["clusterroles"],
            "resourceNames": [name],
            "verbs": ["bind"],
        }
        assert bind in operator
        assert not [r for r in operator if "pods" in r["resources"] and "patch" in r["verbs"]]
        (c,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
        assert {e["name"]: e.get("value") for e in c["env"]}["DDP_TRAINER_POLICY"] == name
    assert render_namespace_trainer("team")[1]["roleRef"]["name"] == name
    other = render("--set", "fullnameOverride=ddp-b")  # a second release: names of its own
    assert one(other, "ValidatingAdmissionPolicy")["metadata"]["name"] == "ddp-b-trainer-progress"
