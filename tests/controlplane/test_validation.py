"""The API server itself refuses bad DDPJobs, with messages that name the field and the fix."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from ddp_devcluster.plane import ControlPlane

pytestmark = pytest.mark.controlplane

ELASTIC = """
apiVersion: ddp.dev/v1alpha1
kind: DDPJob
metadata: {name: digits}
spec:
  nodes: 2
  minNodes: 1
  maxNodes: 4
  nprocPerNode: 2
  trainer: {workload: digits, epochs: 20, globalBatchSize: 256, amp: auto}
  checkpoint: {volume: {persistentVolumeClaim: {claimName: ckpt}}, everySteps: 50, keep: 3}
"""

FIXED = """
apiVersion: ddp.dev/v1alpha1
kind: DDPJob
metadata: {name: fixed}
spec:
  nodes: 2
  command: [torchrun, /scripts/train.py]
  args: [--lr, "0.1"]
"""


@pytest.fixture
def ns(ddpjob_crd: ControlPlane) -> Iterator[str]:
    """A fresh namespace per test, so tests sharing the control plane never collide."""
    name = f"validation-{uuid.uuid4().hex[:8]}"
    ddpjob_crd.kubectl("create", "namespace", name)
    yield name
    ddpjob_crd.kubectl("delete", "namespace", name, "--wait=false")


def job(base: str, name: str | None = None, **spec: Any) -> str:
    """``base`` as YAML with ``name`` and ``spec`` keys replaced; a value of None removes a key."""
    doc = yaml.safe_load(base)
    if name:
        doc["metadata"]["name"] = name
    for key, value in spec.items():
        if value is None:
            doc["spec"].pop(key, None)
        else:
            doc["spec"][key] = value
    return yaml.safe_dump(doc)


def apply(
    cp: ControlPlane, ns: str, manifest: str, *flags: str
) -> subprocess.CompletedProcess[str]:
    return cp.kubectl("apply", "-n", ns, *flags, "-f", "-", input=manifest, check=False)


def scale(cp: ControlPlane, ns: str, job: str, nodes: int) -> subprocess.CompletedProcess[str]:
    """``kubectl scale`` of the job to ``nodes`` (the scale subresource: spec.nodes)."""
    return cp.kubectl("scale", "-n", ns, f"ddpjob/{job}", "--replicas", str(nodes), check=False)


def accepted(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stderr


def refused(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode != 0, f"expected a refusal, got: {result.stdout}"
    for fragment in fragments:
        assert fragment in result.stderr, f"{fragment!r} not in: {result.stderr}"


def get(cp: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    return json.loads(cp.kubectl("get", "ddpjob", name, "-n", ns, "-o", "json").stdout)


def test_a_valid_job_is_accepted_and_defaults_appear(ddpjob_crd: ControlPlane, ns: str) -> None:
    cp = ddpjob_crd
    created = cp.kubectl("apply", "-n", ns, "-f", "-", input=ELASTIC).stdout
    assert "ddpjob.ddp.dev/digits created" in created
    spec = get(cp, ns, "digits")["spec"]
    assert spec["restartPolicy"] == "OnFailure"
    assert spec["backoffLimit"] == 3
    assert spec["workerRestarts"] == 3
    assert spec["suspend"] is False
    assert spec["spread"] == "Preferred"
    assert spec["checkpoint"]["path"] == "/checkpoints"
    assert spec["checkpoint"]["everySteps"] == 50
    assert spec["trainer"]["lr"] == 0.003  # the trainer's own default

    accepted(apply(cp, ns, job(FIXED, checkpoint={"volume": {"emptyDir": {}}})))
    assert get(cp, ns, "fixed")["spec"]["checkpoint"]["everySteps"] == 100
    assert get(cp, ns, "fixed")["spec"]["nprocPerNode"] == 1


def test_nodes_below_one_is_refused(ddpjob_crd: ControlPlane, ns: str) -> None:
    result = apply(ddpjob_crd, ns, job(FIXED, nodes=0))
    refused(result, "spec.nodes", "greater than or equal to 1")


def test_nodes_outside_min_and_max_nodes_is_refused(ddpjob_crd: ControlPlane, ns: str) -> None:
    result = apply(ddpjob_crd, ns, job(ELASTIC, nodes=5))
    refused(result, "spec.nodes", "must be within [spec.minNodes, spec.maxNodes] = [1, 4]")


def test_min_nodes_above_max_nodes_is_refused(ddpjob_crd: ControlPlane, ns: str) -> None:
    result = apply(ddpjob_crd, ns, job(ELASTIC, nodes=3, minNodes=3, maxNodes=2))
    refused(result, "spec.minNodes", "spec.minNodes (3) must not exceed spec.maxNodes (2)")


def test_min_nodes_without_max_nodes_is_refused(ddpjob_crd: ControlPlane, ns: str) -> None:
    result = apply(ddpjob_crd, ns, job(ELASTIC, maxNodes=None))
    refused(result, "spec.minNodes and spec.maxNodes go together")


@pytest.mark.parametrize("value", [0, "four"])
def test_nproc_per_node_is_a_positive_integer_or_auto(
    ddpjob_crd: ControlPlane, ns: str, value: int | str
) -> None:
    result = apply(ddpjob_crd, ns, job(ELASTIC, nprocPerNode=value))
    refused(result, "spec.nprocPerNode", 'must be an integer >= 1 or the string "auto"')
    accepted(apply(ddpjob_crd, ns, job(ELASTIC, nprocPerNode="auto")))


def test_more_processes_than_the_global_batch_is_refused(ddpjob_crd: ControlPlane, ns: str) -> None:
    cp = ddpjob_crd
    many = job(ELASTIC, nprocPerNode=65)  # 4 x 65 processes for a global batch of 256
    refused(
        apply(cp, ns, many), "spec.nprocPerNode", "must not exceed spec.trainer.globalBatchSize"
    )
    # Without spec.trainer the API server's default batch (64) counts: 2 x 33 > 64.
    bare = job(ELASTIC, name="bare", trainer=None, minNodes=None, maxNodes=None, nprocPerNode=33)
    refused(apply(cp, ns, bare), "spec.nodes when not elastic")
    accepted(apply(cp, ns, job(ELASTIC, name="fits", nprocPerNode=64)))  # 4 x 64 = 256
    accepted(apply(cp, ns, job(FIXED, name="own", nprocPerNode=64)))  # its own command


def test_unknown_amp_mode_is_refused(ddpjob_crd: ControlPlane, ns: str) -> None:
    trainer = {"workload": "digits", "amp": "fp8"}
    result = apply(ddpjob_crd, ns, job(ELASTIC, trainer=trainer))
    refused(result, "spec.trainer.amp", 'Unsupported value: "fp8"', '"bf16"')


def test_unknown_workload_is_refused(ddpjob_crd: ControlPlane, ns: str) -> None:
    result = apply(ddpjob_crd, ns, job(ELASTIC, trainer={"workload": "digit"}))
    refused(result, "spec.trainer.workload", "must be one of digits, charlm, synthetic")
    plugin = {"workload": "my_pkg.models:build"}
    accepted(apply(ddpjob_crd, ns, job(ELASTIC, trainer=plugin)))


def test_spread_is_one_of_its_three_values(ddpjob_crd: ControlPlane, ns: str) -> None:
    refused(
        apply(ddpjob_crd, ns, job(ELASTIC, spread="Always")),
        "spec.spread: Unsupported value",
        '"Required", "Preferred", "None"',
    )
    constraint = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone"}
    template = {"topologySpreadConstraints": [constraint]}
    accepted(apply(ddpjob_crd, ns, job(ELASTIC, spread="None", template=template)))
    spec = get(ddpjob_crd, ns, "digits")["spec"]
    assert spec["spread"] == "None" and spec["template"] == template


def test_trainer_and_command_are_mutually_exclusive(ddpjob_crd: ControlPlane, ns: str) -> None:
    result = apply(ddpjob_crd, ns, job(FIXED, trainer={"epochs": 1}))
    refused(result, "spec.trainer and spec.command are mutually exclusive")


@pytest.mark.parametrize(
    ("setting", "where"),
    [
        ("checkpointEverySteps", "spec.checkpoint.everySteps"),
        ("checkpointKeep", "spec.checkpoint.keep"),
    ],
)
def test_checkpoint_settings_under_trainer_are_refused_naming_their_one_knob(
    ddpjob_crd: ControlPlane, ns: str, setting: str, where: str
) -> None:
    result = apply(ddpjob_crd, ns, job(FIXED, trainer={"workload": "digits", setting: 5}))
    refused(result, f"spec.trainer.{setting}", f"is set by {where}", "move it there")
    explained = ddpjob_crd.kubectl("explain", f"ddpjob.spec.trainer.{setting}").stdout
    assert f"Moved: set {where}." in explained


def test_name_longer_than_fifty_is_refused(ddpjob_crd: ControlPlane, ns: str) -> None:
    result = apply(ddpjob_crd, ns, job(FIXED, name="n" * 51))
    refused(result, "metadata.name must be at most 50 characters, not 51", "<name>-rdzv")
    accepted(apply(ddpjob_crd, ns, job(FIXED, name="n" * 50)))


def test_name_must_be_a_dns_1035_label(ddpjob_crd: ControlPlane, ns: str) -> None:
    result = apply(ddpjob_crd, ns, job(FIXED, name="1digits"))
    refused(result, "metadata.name must be a DNS-1035 label")


def test_scale_within_bounds_is_accepted_and_beyond_is_refused(
    ddpjob_crd: ControlPlane, ns: str
) -> None:
    cp = ddpjob_crd
    accepted(apply(cp, ns, ELASTIC))
    accepted(scale(cp, ns, "digits", 3))
    nodes = cp.kubectl("get", "ddpjob", "digits", "-n", ns, "-o", "jsonpath={.spec.nodes}")
    assert nodes.stdout == "3"
    refused(
        scale(cp, ns, "digits", 5),
        "spec.nodes (5) must be within [spec.minNodes, spec.maxNodes] = [1, 4]",
    )


def test_nodes_of_a_job_that_is_not_elastic_cannot_change(
    ddpjob_crd: ControlPlane, ns: str
) -> None:
    accepted(apply(ddpjob_crd, ns, FIXED))
    refused(scale(ddpjob_crd, ns, "fixed", 3), "spec.nodes", "set spec.minNodes and spec.maxNodes")


CKPT = {"volume": {"persistentVolumeClaim": {"claimName": "ckpt"}}, "everySteps": 50, "keep": 3}


# (field, base manifest, the change): every change would alter the pods, so each is refused.
IMMUTABLE_CHANGES: list[tuple[str, str, dict[str, Any]]] = [
    ("minNodes", ELASTIC, {"minNodes": 2}),
    ("maxNodes", ELASTIC, {"maxNodes": 8}),
    ("nprocPerNode", ELASTIC, {"nprocPerNode": "auto"}),
    ("image", ELASTIC, {"image": "example.com/trainer:2"}),
    ("imagePullPolicy", ELASTIC, {"imagePullPolicy": "Always"}),
    ("trainer", ELASTIC, {"trainer": {"workload": "digits", "epochs": 21}}),
    ("trainer", ELASTIC, {"trainer": None}),  # removing it is a change too
    ("command", FIXED, {"command": ["torchrun", "/scripts/other.py"]}),
    ("command", FIXED, {"command": None}),
    ("args", FIXED, {"args": ["--lr", "0.2"]}),
    ("resources", ELASTIC, {"resources": {"limits": {"cpu": 2}}}),
    (
        "checkpoint",
        ELASTIC,
        {"checkpoint": {**CKPT, "volume": {"persistentVolumeClaim": {"claimName": "other"}}}},
    ),
    ("checkpoint", ELASTIC, {"checkpoint": {**CKPT, "everySteps": 10}}),
    ("template", ELASTIC, {"template": {"nodeSelector": {"gpu": "a100"}}}),
    ("workerRestarts", ELASTIC, {"workerRestarts": 0}),
    ("spread", ELASTIC, {"spread": "Required"}),
    ("faultTolerance", ELASTIC, {"faultTolerance": {"mode": "PerStep"}}),  # added is a change
]


@pytest.mark.parametrize(
    ("field", "base", "change"),
    IMMUTABLE_CHANGES,
    ids=[f"{f}-{'removed' if None in c.values() else 'changed'}" for f, _, c in IMMUTABLE_CHANGES],
)
def test_changes_that_would_alter_the_pods_are_refused(
    ddpjob_crd: ControlPlane, ns: str, field: str, base: str, change: dict[str, Any]
) -> None:
    accepted(apply(ddpjob_crd, ns, base))
    result = apply(ddpjob_crd, ns, job(base, **change))
    refused(result, f"spec.{field}: Invalid value", f"spec.{field} is immutable")
    assert "create a new DDPJob instead" in result.stderr


def test_changes_to_a_nested_template_field_are_refused(ddpjob_crd: ControlPlane, ns: str) -> None:
    env = [{"name": "NCCL_DEBUG", "value": "INFO"}]
    accepted(apply(ddpjob_crd, ns, job(ELASTIC, template={"env": env})))
    changed = [{"name": "NCCL_DEBUG", "value": "WARN"}]
    result = apply(ddpjob_crd, ns, job(ELASTIC, template={"env": changed}))
    refused(result, "spec.template is immutable")


def test_fields_that_leave_the_pods_alone_stay_mutable(ddpjob_crd: ControlPlane, ns: str) -> None:
    cp = ddpjob_crd
    accepted(apply(cp, ns, ELASTIC))
    changes: dict[str, Any] = {
        "nodes": 4,
        "suspend": True,
        "backoffLimit": 10,
        "activeDeadlineSeconds": 3600,
        "ttlSecondsAfterFinished": 60,
        "restartPolicy": "ExitCode",
    }
    accepted(apply(cp, ns, job(ELASTIC, **changes)))
    spec = get(cp, ns, "digits")["spec"]
    assert {k: spec[k] for k in changes} == changes


def test_unknown_fields_are_refused_with_strict_validation(
    ddpjob_crd: ControlPlane, ns: str
) -> None:
    for manifest, path in [
        (job(ELASTIC, replicas=3), "spec.replicas"),
        (job(ELASTIC, trainer={"epoch": 3}), "spec.trainer.epoch"),
        (job(ELASTIC, checkpoint={**CKPT, "every": 5}), "spec.checkpoint.every"),
        (job(ELASTIC, template={"nodeSelectors": {}}), "spec.template.nodeSelectors"),
    ]:
        refused(apply(ddpjob_crd, ns, manifest, "--validate=strict"), f'unknown field "{path}"')


def test_a_bad_resource_quantity_is_refused(ddpjob_crd: ControlPlane, ns: str) -> None:
    result = apply(ddpjob_crd, ns, job(ELASTIC, resources={"limits": {"memory": "lots"}}))
    refused(result, "spec.resources.limits[memory]", "must be a quantity")


def test_explain_prints_the_field_description(ddpjob_crd: ControlPlane) -> None:
    out = ddpjob_crd.kubectl("explain", "ddpjob.spec.nodes").stdout
    assert "FIELD: nodes <integer>" in out
    assert "Desired number of nodes (pods)" in out
    assert "kubectl scale" in " ".join(out.split())


def test_status_fills_the_printer_columns_and_the_scale_subresource(
    ddpjob_crd: ControlPlane, ns: str
) -> None:
    cp = ddpjob_crd
    accepted(apply(cp, ns, ELASTIC))
    status = {
        "phase": "Running",
        "nodes": 2,
        "readyNodes": 1,
        "ready": "1/2",
        "selector": "ddp.dev/job-name=digits",
        "image": "trainer:1",
        "restarts": 1,
        "disruptions": 2,
        "goodput": 0.9,
        "firstReportTime": "2026-11-26T10:00:30Z",
        "progress": {
            "epoch": 3,
            "step": 120,
            "loss": 0.25,
            "lastCheckpoint": "step-100",
            "estimatedRemainingSeconds": 342,
            "eta": "5m42s",
            "groups": 2,
        },
    }
    patch = json.dumps({"status": status})
    cp.kubectl(
        "patch", "ddpjob/digits", "-n", ns, "--subresource=status", "--type=merge", "-p", patch
    )
    row = cp.kubectl("get", "ddpj", "digits", "-n", ns, "-o", "wide").stdout.splitlines()[1]
    assert row.split()[:12] == [
        "digits", "Running", "1/2", "3", "120", "0.25", "2", "step-100", "5m42s", "1", "2", "0.9"
    ]  # fmt: skip
    kept = json.loads(cp.kubectl("get", "ddpj", "digits", "-n", ns, "-o", "json").stdout)
    assert kept["status"]["image"] == "trainer:1"  # in the schema: not pruned
    assert kept["status"]["firstReportTime"] == "2026-11-26T10:00:30Z"
    assert kept["status"]["progress"]["eta"] == "5m42s"
    scale = cp.request("GET", f"/apis/ddp.dev/v1alpha1/namespaces/{ns}/ddpjobs/digits/scale")
    assert scale["spec"]["replicas"] == 2
    assert scale["status"] == {"replicas": 2, "selector": "ddp.dev/job-name=digits"}


def test_a_progress_loss_may_be_null(ddpjob_crd: ControlPlane, ns: str) -> None:
    """A NaN loss is reported as null. Written whole (a JSON patch, not a merge patch, which
    removes the key), the null is kept: without ``nullable`` the API server drops it."""
    cp = ddpjob_crd
    accepted(apply(cp, ns, ELASTIC))
    ops = [{"op": "add", "path": "/status", "value": {"progress": {"step": 9, "loss": None}}}]
    result = cp.kubectl(
        "patch", "ddpjob/digits", "-n", ns, "--subresource=status", "--type=json",
        "-p", json.dumps(ops), check=False,
    )  # fmt: skip
    accepted(result)
    assert get(cp, ns, "digits")["status"]["progress"] == {"step": 9, "loss": None}


def test_fault_tolerance_per_step_is_accepted_and_its_rules_name_the_fix(
    ddpjob_crd: ControlPlane, ns: str
) -> None:
    cp = ddpjob_crd
    per_step = {"mode": "PerStep", "minGroups": 1, "groupTimeoutSeconds": 10}
    accepted(apply(cp, ns, job(ELASTIC, faultTolerance=per_step)))
    assert get(cp, ns, "digits")["spec"]["faultTolerance"] == per_step
    accepted(apply(cp, ns, job(FIXED, faultTolerance={"mode": "PerStep"})))
    assert get(cp, ns, "fixed")["spec"]["faultTolerance"] == {"mode": "PerStep"}  # knobs unset
    for ft, base, fragments in [
        (
            {"minGroups": 2},
            FIXED,
            (
                "spec.faultTolerance.minGroups and spec.faultTolerance.groupTimeoutSeconds apply to"
                " mode PerStep only",
                "set spec.faultTolerance.mode to PerStep",
            ),
        ),
        (
            {"mode": "PerStep", "minGroups": 2},
            ELASTIC,  # minNodes 1
            (
                "spec.faultTolerance.minGroups (2) must not exceed spec.minNodes (1)",
                "Lower minGroups or raise minNodes",
            ),
        ),
        (
            {"mode": "PerStep", "minGroups": 3},
            FIXED,  # nodes 2
            ("spec.faultTolerance.minGroups (3) must not exceed spec.nodes (2)",),
        ),
        (
            {"mode": "PerStep", "groupTimeoutSeconds": 601},
            FIXED,
            ("spec.faultTolerance.groupTimeoutSeconds", "less than or equal to 600"),
        ),
        ({"mode": "Always"}, FIXED, ("spec.faultTolerance.mode", '"Restart", "PerStep"')),
    ]:
        refused(apply(cp, ns, job(base, name="bad", faultTolerance=ft)), *fragments)
    # The mode cannot change under running pods.
    result = apply(cp, ns, job(FIXED, faultTolerance={"mode": "Restart"}))
    refused(result, "spec.faultTolerance is immutable")
    explained = " ".join(cp.kubectl("explain", "ddpjob.spec.faultTolerance.mode").stdout.split())
    assert "PerStep: each node pod is a replica group of its own" in explained
    assert "Default: Restart." in explained
