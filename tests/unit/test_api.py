"""The DDPJob models: defaults, camelCase names, and the rules that need no API server."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from ddp_api.ddpjob import (
    SPEC_IMMUTABLE_FIELDS,
    CheckpointSpec,
    DDPJob,
    DDPJobPhase,
    DDPJobSpec,
    DDPJobStatus,
    RestartPolicy,
    Spread,
)
from ddp_api.trainer_config import TrainerConfig


def spec(**fields: Any) -> DDPJobSpec:
    return DDPJobSpec.model_validate(fields)


def test_an_empty_spec_gets_the_documented_defaults() -> None:
    s = spec()
    assert s.nodes == 1
    assert s.nproc_per_node == 1
    assert s.restart_policy is RestartPolicy.ON_FAILURE
    assert s.backoff_limit == 3
    assert s.worker_restarts == 3
    assert s.suspend is False
    assert s.spread is Spread.PREFERRED
    assert s.trainer is None and s.command is None and s.checkpoint is None
    assert not s.elastic
    assert s.node_range() == (1, 1)


def test_camel_case_in_and_out_and_snake_case_by_name() -> None:
    s = spec(nodes=2, minNodes=1, maxNodes=4, nprocPerNode="auto", workerRestarts=0)
    assert (s.min_nodes, s.max_nodes, s.nproc_per_node, s.worker_restarts) == (1, 4, "auto", 0)
    assert s.elastic and s.node_range() == (1, 4)
    assert DDPJobSpec(nodes=2, min_nodes=1, max_nodes=4) == spec(nodes=2, minNodes=1, maxNodes=4)
    out = s.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert out["minNodes"] == 1 and out["nprocPerNode"] == "auto"
    assert out["restartPolicy"] == "OnFailure"


def test_checkpoint_defaults_and_an_absolute_path() -> None:
    c = CheckpointSpec.model_validate({"volume": {"persistentVolumeClaim": {"claimName": "x"}}})
    assert (c.path, c.every_steps, c.keep) == ("/checkpoints", 100, 3)
    with pytest.raises(ValidationError, match="volume"):
        CheckpointSpec.model_validate({})
    with pytest.raises(ValidationError, match="path"):
        CheckpointSpec.model_validate({"volume": {"emptyDir": {}}, "path": "relative"})


def test_trainer_is_the_trainers_own_settings_model() -> None:
    s = spec(trainer={"workload": "digits", "epochs": 20, "globalBatchSize": 256, "amp": "bf16"})
    assert isinstance(s.trainer, TrainerConfig)
    assert (s.trainer.epochs, s.trainer.global_batch_size, s.trainer.amp) == (20, 256, "bf16")
    with pytest.raises(ValidationError, match="amp"):
        spec(trainer={"amp": "fp8"})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"nodes": 0}, "nodes"),
        ({"minNodes": 1}, "minNodes and spec.maxNodes go together"),
        ({"nodes": 3, "minNodes": 3, "maxNodes": 2}, r"minNodes \(3\) must not exceed"),
        ({"nodes": 5, "minNodes": 1, "maxNodes": 4}, r"nodes \(5\) must be within"),
        ({"trainer": {}, "command": ["python"]}, "mutually exclusive"),
        ({"nprocPerNode": 0}, "nprocPerNode"),
        ({"nprocPerNode": "four"}, "nprocPerNode"),
        ({"nprocPerNode": "4"}, "nprocPerNode"),  # as strict as the API server
        ({"backoffLimit": -1}, "backoffLimit"),
        ({"activeDeadlineSeconds": 0}, "activeDeadlineSeconds"),
        ({"restartPolicy": "Always"}, "restartPolicy"),
        ({"imagePullPolicy": "Sometimes"}, "imagePullPolicy"),
        ({"spread": "Always"}, "spread"),
        ({"spread": "required"}, "spread"),  # as strict as the API server's enum
        ({"template": {"topologySpreadConstraints": [{}] * 9}}, "topologySpreadConstraints"),
        ({"replicas": 3}, "replicas"),  # unknown fields are refused
        ({"template": {"nodeSelectors": {}}}, "nodeSelectors"),
        ({"resources": {"limits": {"cpu": 1.5}}}, "limits"),
        ({"nodes": 2, "nprocPerNode": 40}, "must not exceed spec.trainer.globalBatchSize"),
        (
            {"minNodes": 1, "maxNodes": 4, "nprocPerNode": 8, "trainer": {"globalBatchSize": 16}},
            r"spec.maxNodes .* x spec.nprocPerNode",
        ),
    ],
)
def test_bad_specs_are_refused_naming_the_field(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        spec(**fields)


def test_a_full_spec_round_trips() -> None:
    raw = {
        "nodes": 2,
        "minNodes": 1,
        "maxNodes": 4,
        "nprocPerNode": 2,
        "image": "example.com/trainer:1",
        "imagePullPolicy": "IfNotPresent",
        "args": ["--seed", "1"],
        "resources": {"limits": {"cpu": 8, "memory": "32Gi"}, "requests": {"cpu": "500m"}},
        "checkpoint": {"volume": {"persistentVolumeClaim": {"claimName": "ckpt"}}, "keep": 5},
        "restartPolicy": "ExitCode",
        "template": {
            "metadata": {"labels": {"team": "ml"}},
            "nodeSelector": {"gpu": "a100"},
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
            "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
            "imagePullSecrets": [{"name": "registry"}],
            "serviceAccountName": "trainer",
            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone"}],
        },
        "spread": "Required",
    }
    s = spec(**raw)
    assert s.template is not None and s.template.image_pull_secrets is not None
    assert s.template.image_pull_secrets[0].name == "registry"
    out = s.model_dump(by_alias=True, exclude_defaults=True, mode="json")
    assert out == raw


def test_immutable_fields_are_spec_fields() -> None:
    aliases = {f.alias for f in DDPJobSpec.model_fields.values()}
    assert set(SPEC_IMMUTABLE_FIELDS) <= aliases
    assert {"nodes", "suspend", "backoffLimit"}.isdisjoint(SPEC_IMMUTABLE_FIELDS)
    assert "spread" in SPEC_IMMUTABLE_FIELDS  # it shapes the pods


def test_status_as_the_operator_writes_it() -> None:
    status = DDPJobStatus.model_validate(
        {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "reason": "AllNodesReady"}],
            "nodes": 3,
            "readyNodes": 2,
            "ready": "2/3",
            "startTime": "2026-01-01T00:00:00Z",
            "progress": {"epoch": 1, "step": 40, "loss": 0.5, "lastCheckpoint": "step-40"},
        }
    )
    assert status.phase is DDPJobPhase.RUNNING
    assert status.progress is not None and status.progress.step == 40
    with pytest.raises(ValidationError, match="phase"):
        DDPJobStatus.model_validate({"phase": "Done"})


def test_a_whole_job_and_its_name_limit() -> None:
    j = DDPJob.model_validate(
        {"apiVersion": "ddp.dev/v1alpha1", "kind": "DDPJob", "metadata": {"name": "x"}, "spec": {}}
    )
    assert j.spec.nodes == 1 and j.status is None
    with pytest.raises(ValidationError, match="at most 50 characters, not 51"):
        DDPJob.model_validate({"metadata": {"name": "n" * 51}, "spec": {}})


@pytest.mark.parametrize("setting", ["checkpointEverySteps", "checkpointKeep"])
def test_checkpoint_settings_have_one_knob_spec_checkpoint(setting: str) -> None:
    with pytest.raises(ValidationError, match=rf"spec.trainer.{setting} is set by spec.checkpoint"):
        DDPJobSpec.model_validate({"trainer": {"workload": "digits", setting: 5}})
    spec = DDPJobSpec.model_validate(
        {"trainer": {"workload": "digits"}, "checkpoint": {"volume": {}, "everySteps": 0}}
    )
    assert spec.checkpoint is not None and spec.checkpoint.every_steps == 0  # as the trainer's


def test_each_spec_rule_is_one_declaration_for_the_api_server_and_the_operator() -> None:
    from ddp_api.ddpjob import SPEC_RULES

    aliases = {f.alias for f in DDPJobSpec.model_fields.values()}
    rule = next(r for r in SPEC_RULES if r.field == "nodes" and r.holds is not None)
    # The operator's message and the API server's messageExpression come from one template.
    entry = rule.entry()
    assert entry["messageExpression"] == (
        "'spec.nodes (%d) must be within [spec.minNodes, spec.maxNodes] = [%d, %d]'"
        ".format([self.nodes, self.minNodes, self.maxNodes])"
    )
    with pytest.raises(ValidationError, match=r"spec.nodes \(5\) must be within .* = \[1, 4\]"):
        DDPJobSpec.model_validate({"nodes": 5, "minNodes": 1, "maxNodes": 4})
    for r in SPEC_RULES:
        assert r.field.split(".")[0] in aliases


def test_more_processes_than_the_global_batch_is_refused_only_for_the_bundled_trainer() -> None:
    from ddp_api.ddpjob import SPEC_RULES

    spec(nodes=2, nprocPerNode=32)  # 64 processes, the default globalBatchSize
    spec(minNodes=1, maxNodes=4, nprocPerNode=8, trainer={"globalBatchSize": 32})
    spec(nodes=8, nprocPerNode=64, command=["torchrun", "/train.py"])  # no trainer batch
    spec(nodes=8, nprocPerNode="auto")  # the GPUs are counted on the node, not here
    (rule,) = [r for r in SPEC_RULES if "globalBatchSize" in r.cel]
    # The API server gets the same rule, with the defaults it applies in mind.
    assert "has(self.command)" in rule.cel and "type(self.nprocPerNode) != int" in rule.cel
    assert "has(self.maxNodes) ? self.maxNodes : self.nodes" in rule.cel
    assert rule.cel.endswith(" : 64)") and rule.entry()["fieldPath"] == ".nprocPerNode"
