"""The operator and the trainer agree: what one renders or expects, the other reads or writes."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from pydantic import ValidationError

from ddp_api import contract, rdzv_store
from ddp_api.ddpjob import DDPJob, Progress
from ddp_api.trainer_config import load_settings
from ddp_operator import kube, render, reports
from ddp_operator.planner import views
from ddp_trainer.launch import store_probe
from ddp_trainer.reporting.progress import (
    configmap_patch,
    pod_patch,
    progress_pod,
    progress_record,
    reporting_target,
)

CFG = render.OperatorConfig(default_image="trainer:test")
JOB = DDPJob.model_validate(
    {
        "metadata": {"name": "digits", "namespace": "team", "uid": "u-1", "generation": 1},
        "spec": {
            "nodes": 2,
            "trainer": {"workload": "digits", "epochs": 4, "holdAtSteps": [5]},
            "checkpoint": {"volume": {"emptyDir": {}}, "path": "/ckpt", "everySteps": 7},
        },
    }
)


def test_the_trainers_progress_record_is_what_the_api_declares_and_the_operator_accepts() -> None:
    sent = progress_record(
        epoch=1,
        step=30,
        total_steps=88,
        loss=0.25,
        samples_per_second=900.0,
        last_checkpoint="step-00000028.pt",
        world_size=2,
        now=0.0,
        held_at_step=30,
    )
    # Every key the trainer sends is a field of Progress (extra fields are refused) ...
    parsed = Progress.model_validate(sent)
    # ... and every field of Progress but the operator's estimates is one the trainer sends
    # (groups: in PerStep mode, which this record is not from).
    declared = {f.alias for f in Progress.model_fields.values()} - set(reports.COMPUTED)
    assert set(sent) | {"groups"} == declared
    assert parsed.held_at_step == 30 and parsed.updated_at == "1970-01-01T00:00:00Z"
    # The operator reads the ConfigMap the trainer patches, and keeps every value.
    configmap = {"metadata": {"name": "digits-progress"}, **configmap_patch(sent)}
    assert reports.job_of(configmap) == "digits"
    assert reports.parse(reports.record_of(configmap)) == {"groups": None, **sent}
    assert set(reports.FIELDS) == declared


def test_a_loss_that_is_not_finite_is_reported_as_null_and_accepted() -> None:
    sent = progress_record(
        epoch=0, step=0, total_steps=9, loss=float("nan"), samples_per_second=0.0,
        last_checkpoint=None, world_size=1, now=0.0,
    )  # fmt: skip
    assert sent["loss"] is None
    configmap = {"metadata": {"name": "j-progress"}, **configmap_patch(sent)}
    assert reports.parse(reports.record_of(configmap))["loss"] is None


def test_the_trainer_reads_the_environment_the_operator_renders() -> None:
    pod = render.render_worker(JOB, 0, 0, CFG)
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"] if "value" in e}
    config, checkpoint_dir = load_settings([], environ=env)
    assert config.epochs == 4 and config.hold_at_steps == (5,)
    assert config.checkpoint_every_steps == 7  # spec.checkpoint.everySteps reaches the trainer
    assert checkpoint_dir == Path("/ckpt")
    assert reporting_target(env) == ("digits", "team")
    names = {e["name"] for e in pod["spec"]["containers"][0]["env"]}
    assert {
        contract.ENV_JOB_NAME,
        contract.ENV_JOB_NAMESPACE,
        contract.ENV_NODE_INDEX,
        contract.ENV_CHECKPOINT_DIR,
        contract.ENV_TRAINER_CONFIG,
    } <= names


@pytest.mark.parametrize("spec", [{}, {"trainer": {"metricsPort": 9100}}])
def test_the_declared_metrics_port_is_the_one_the_trainer_serves(spec: dict) -> None:
    job = DDPJob.model_validate({"metadata": {"name": "m", "namespace": "team"}, "spec": spec})
    container = render.render_worker(job, 0, 0, CFG)["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    config, _ = load_settings([], environ=env)
    declared = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert declared[contract.METRICS_PORT_NAME] == config.metrics_port


def test_both_sides_write_and_read_one_timestamp_format() -> None:
    when = dt.datetime(2026, 11, 22, 15, 4, 5, tzinfo=dt.UTC)
    assert contract.rfc3339(when) == contract.rfc3339(when.timestamp()) == "2026-11-22T15:04:05Z"
    assert contract.parse_rfc3339("2026-11-22T15:04:05Z") == when
    assert contract.parse_rfc3339(None) is None
    with pytest.raises(ValueError):
        contract.parse_rfc3339("22/11/2026")


def test_the_trainer_patches_its_own_pods_annotation_which_the_operator_reads() -> None:
    pod = render.render_worker(JOB, 0, 0, CFG)
    env = {
        e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]
    }
    assert env[contract.ENV_PROGRESS_INTO] == contract.PROGRESS_INTO_POD
    assert env[contract.ENV_POD_NAME] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # The kubelet resolves the downward API: the trainer then patches this very pod ...
    resolved = {**env, contract.ENV_POD_NAME: pod["metadata"]["name"]}
    assert progress_pod(resolved) == "digits-node-0"
    no_name = {**resolved, contract.ENV_POD_NAME: "", "HOSTNAME": "digits-node-0"}
    assert progress_pod(no_name) == "digits-node-0"  # the hostname the operator sets
    assert contract.pod_path("team", "digits-node-0") == (
        kube.path_of(pod) + "/" + pod["metadata"]["name"]
    )
    assert pod["spec"]["serviceAccountName"] == render.PROGRESS_ACCOUNT
    # ... and the operator reads back what it wrote, from its cache's view of the pod.
    sent = progress_record(
        epoch=0, step=3, total_steps=9, loss=1.5, samples_per_second=2.0,
        last_checkpoint=None, world_size=2, now=0.0,
    )  # fmt: skip
    pod["metadata"]["uid"] = "p-1"
    pod["metadata"]["annotations"].update(pod_patch(sent)["metadata"]["annotations"])
    record = views.view(pod).progress
    assert record is not None and record.owner == "u-1"
    assert reports.parse(record) == {"groups": None, **sent}
    # The namespace's account is bound to the chart's ClusterRole (the release's name).
    account, binding = render.render_namespace_trainer("team", "r-trainer-progress")
    assert account["metadata"]["name"] == render.PROGRESS_ACCOUNT
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": render.PROGRESS_ACCOUNT, "namespace": "team"}
    ]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "r-trainer-progress",
    }


def test_where_the_policy_is_not_seen_the_trainer_patches_the_configmap_its_pod_may_patch() -> None:
    configmap = render.render_progress_configmap(JOB)
    assert contract.progress_configmap_path("team", "digits") == (
        kube.path_of(configmap) + "/" + configmap["metadata"]["name"]
    )
    pod = render.render_worker(JOB, 0, 0, render.OperatorConfig(progress_in_pod=False))
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"] if "value" in e}
    assert env[contract.ENV_PROGRESS_INTO] == contract.PROGRESS_INTO_CONFIGMAP
    assert progress_pod({**env, contract.ENV_POD_NAME: "digits-node-0"}) is None
    account, role, binding = render.render_trainer_identity(JOB)
    assert pod["spec"]["serviceAccountName"] == account["metadata"]["name"]
    assert binding["subjects"][0]["name"] == account["metadata"]["name"]
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [configmap["metadata"]["name"]],
            "verbs": ["patch"],
        }
    ]
    assert (contract.GROUP, contract.VERSION, contract.KIND) == ("ddp.dev", "v1alpha1", "DDPJob")


def test_the_store_pod_listens_where_every_node_looks_for_it() -> None:
    store = render.render_store(JOB, CFG)["spec"]["containers"][0]
    worker = render.render_worker(JOB, 0, 0, CFG)["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in worker["env"] if "value" in e}
    host, port = store_probe.split_endpoint(env["PET_RDZV_ENDPOINT"])
    rdzv_service = render.render_services(JOB)[0]
    assert host == f"{rdzv_service['metadata']['name']}.team.svc"
    assert port == rdzv_service["spec"]["ports"][0]["targetPort"] == contract.RDZV_PORT
    assert store["args"][store["args"].index("--port") + 1] == str(contract.RDZV_PORT)
    # The store's and the agent's own defaults, when started by hand, are the same port.
    assert rdzv_store.build_parser().parse_args([]).port == contract.RDZV_PORT
    assert store_probe.split_endpoint("store") == ("store", contract.RDZV_PORT)


def test_every_label_and_key_of_the_project_carries_the_api_group() -> None:
    keys = [render.LABEL_JOB, render.LABEL_ROLE, render.LABEL_INDEX, render.ANNOTATION_ATTEMPT]
    keys.append(store_probe.STORE_ID_KEY)
    assert all(k.startswith(contract.LABEL_PREFIX) for k in keys)
    assert contract.LABEL_PREFIX == f"{contract.GROUP}/" == "ddp.dev/"
    labels = render.render_worker(JOB, 0, 0, CFG)["metadata"]["labels"]
    assert labels[render.LABEL_JOB] == "digits" and labels[render.LABEL_INDEX] == "0"


def test_a_ddpjob_is_read_only_at_the_contracts_api_version_and_kind() -> None:
    body = {"metadata": {"name": "j"}, "spec": {}}
    job = DDPJob.model_validate(body)
    assert (job.api_version, job.kind) == (contract.API_VERSION, contract.KIND)
    for key, other in (("apiVersion", "ddp.dev/v1"), ("kind", "PyTorchJob")):
        with pytest.raises(ValidationError):
            DDPJob.model_validate({**body, key: other})


def test_a_termination_message_is_read_as_kind_and_words() -> None:
    termination_kind = contract.termination_kind
    text = "IncompatibleResume: cannot resume: the settings differ"
    assert termination_kind(text) == ("IncompatibleResume", "cannot resume: the settings differ")
    assert termination_kind("ValueError: x") == ("ValueError", "x")
    for plain in ("killed: out of memory", "no kind here", "", "Two Words: x"):
        assert termination_kind(plain) == ("", plain.strip())
