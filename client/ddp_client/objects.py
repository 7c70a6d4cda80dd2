"""The objects the client creates, built without I/O: a script's ConfigMap and DDPJob, and the
short-lived pods that print a job's ``metrics.jsonl`` or its nodes' kept logs from its
checkpoint volume."""

from __future__ import annotations

import inspect
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from ddp_api.contract import API_VERSION, KIND, LOGS_DIR, RUN_LOG_FILE
from ddp_api.ddpjob import MAX_NAME_LENGTH, CheckpointSpec, DDPJob
from ddp_api.metav1 import owner_reference
from ddp_api.pods import (
    DEFAULT_IMAGE,
    RESTRICTED_CONTAINER,
    RESTRICTED_POD,
    trainer_image,
    worker_name,
)
from ddp_api.trainer_config import validation_message

SCRIPT_DIR = "/scripts"  # where a submitted script's ConfigMap is mounted
SCRIPT_VOLUME = "script"
# A ConfigMap holds at most 1 MiB in all; leave room for its metadata.
MAX_SCRIPT_BYTES = 1_000_000
MANAGED_BY = {"app.kubernetes.io/managed-by": "kubectl-ddp"}
READER_CONTAINER = "metrics"
LOGS_READER_CONTAINER = "logs"
READER_DEADLINE_S = 600  # a reader pod left behind by a killed client ends by itself


class InvalidJob(ValueError):
    """The options make a DDPJob the API would refuse; the message says which field and why."""


@dataclass(frozen=True)
class ScriptOptions:
    """How a script runs: under torchrun (``SCRIPT ARGS``) on ``nodes`` pods of
    ``nproc_per_node`` workers each (``kubectl ddp submit`` flags in brackets)."""

    name: str | None = None  # [--name] default: the script's name and a random suffix
    nodes: int | None = None  # [--nodes] default: max_nodes when elastic, else 1
    nproc_per_node: int | str = 1  # [--nproc] an integer or "auto"
    min_nodes: int | None = None  # [--min] elastic bounds: both or neither
    max_nodes: int | None = None  # [--max]
    image: str | None = None  # [--image] default: the operator's trainer image (it has torch)
    checkpoint_claim: str | None = None  # [--checkpoint-claim] a PVC mounted at /checkpoints
    args: Sequence[str] = field(default=())  # [-- ARGS] after the script's path
    launcher: str = "auto"  # [--launcher] node | torchrun | auto: see LAUNCHERS
    fault_tolerance: str | None = None  # [--fault-tolerance] Restart (the API's default) | PerStep
    min_groups: int | None = None  # [--min-groups] PerStep: the fewest groups that may train
    group_timeout_s: int | None = None  # [--group-timeout] PerStep: a silent group is dropped


# What starts torchrun in a submitted script's pods. ``node``: the trainer image's node wrapper
# (``python -m ddp_trainer.node``, as the bundled trainer's pods run it), which starts torchrun
# again when the rendezvous store pod is replaced, keeps the pod's log on the checkpoint volume
# and leaves the first worker's exception as the pod's termination message, which the job's
# failure quotes. ``torchrun``: plain torchrun, for an image without ``ddp_trainer``. ``auto``:
# the wrapper in the trainer image (no ``--image``), plain torchrun in any other.
LAUNCHERS = {
    "node": ["python", "-m", "ddp_trainer.node"],
    "torchrun": ["torchrun"],
}
AUTO_LAUNCHER = "auto"


def launcher_command(options: ScriptOptions) -> list[str]:
    """The command that runs a submitted script (its path and arguments follow)."""
    name = options.launcher
    if name == AUTO_LAUNCHER:
        name = "torchrun" if options.image else "node"
    if name not in LAUNCHERS:
        known = ", ".join([*LAUNCHERS, AUTO_LAUNCHER])
        raise InvalidJob(f"launcher {options.launcher!r} is not one of {known}")
    return list(LAUNCHERS[name])


def job_name(script_file: str, suffix: str) -> str:
    """A DDPJob name from a script's file name: ``Train_v2.py`` -> ``train-v2-<suffix>``."""
    stem = posixpath.basename(script_file.replace("\\", "/")).rsplit(".", 1)[0].lower()
    stem = re.sub(r"[^a-z0-9]+", "-", stem).strip("-")
    if not stem or not stem[0].isalpha():
        stem = f"job-{stem}".rstrip("-")
    stem = stem[: MAX_NAME_LENGTH - len(suffix) - 1].rstrip("-")
    return f"{stem}-{suffix}"


def script_key(script_file: str) -> str:
    """The ConfigMap key (and file name under /scripts) of a script: its own name when that
    is a valid key, else ``train.py``."""
    base = posixpath.basename(script_file.replace("\\", "/"))
    return (
        base if re.fullmatch(r"[-._a-zA-Z0-9]+", base) and base not in (".", "..") else "train.py"
    )


def script_objects(
    script_file: str, source: str, options: ScriptOptions, namespace: str, suffix: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ConfigMap holding the script and the DDPJob that runs it under torchrun (started by
    ``options.launcher``), both named after the job. Raises InvalidJob when the DDPJob would be
    refused."""
    name = options.name or job_name(script_file, suffix)
    key = script_key(script_file)
    if len(source.encode()) > MAX_SCRIPT_BYTES:
        raise InvalidJob(
            f"{script_file} is larger than {MAX_SCRIPT_BYTES} bytes, more than a ConfigMap holds"
        )
    elastic = options.min_nodes is not None or options.max_nodes is not None
    nodes = options.nodes
    if nodes is None:
        nodes = options.max_nodes if elastic and options.max_nodes is not None else 1
    spec: dict[str, Any] = {
        "nodes": nodes,
        "nprocPerNode": options.nproc_per_node,
        "command": launcher_command(options),
        "args": [posixpath.join(SCRIPT_DIR, key), *options.args],
        "template": {
            "volumes": [{"name": SCRIPT_VOLUME, "configMap": {"name": name}}],
            "volumeMounts": [{"name": SCRIPT_VOLUME, "mountPath": SCRIPT_DIR, "readOnly": True}],
        },
    }
    if options.min_nodes is not None:
        spec["minNodes"] = options.min_nodes
    if options.max_nodes is not None:
        spec["maxNodes"] = options.max_nodes
    if options.image:
        spec["image"] = options.image
    tolerance: dict[str, Any] = {}
    if options.fault_tolerance is not None:
        tolerance["mode"] = options.fault_tolerance
    if options.min_groups is not None:
        tolerance["minGroups"] = options.min_groups
    if options.group_timeout_s is not None:
        tolerance["groupTimeoutSeconds"] = options.group_timeout_s
    if tolerance:
        spec["faultTolerance"] = tolerance
    if options.checkpoint_claim:
        spec["checkpoint"] = {
            "volume": {"persistentVolumeClaim": {"claimName": options.checkpoint_claim}}
        }
    metadata = {"name": name, "namespace": namespace, "labels": dict(MANAGED_BY)}
    job = {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}
    try:
        DDPJob.model_validate(job)
    except ValidationError as error:
        raise InvalidJob(validation_message(error, first_only=True)) from None
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(MANAGED_BY)},
        "data": {key: source},
    }
    return config_map, job


def reader_image(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> str:
    """The image that reads the checkpoint volume: the job's: ``spec.image``, else as its pods
    run it (the operator fills in its default image), else as the operator last saw them run
    it (``status.image``: a job without pods), else the operator's built-in default."""
    spec_image = (job.get("spec") or {}).get("image")
    if spec_image:
        return str(spec_image)
    running = next((image for pod in pods if (image := trainer_image(pod))), None)
    return running or str((job.get("status") or {}).get("image") or DEFAULT_IMAGE)


def checkpoint_path(job: Mapping[str, Any], keeps: str) -> str:
    """Where the job's pods mount its checkpoint volume; raises InvalidJob without one, saying
    that the job ``keeps`` nothing there to read."""
    raw = (job.get("spec") or {}).get("checkpoint")
    if not raw:
        name = job["metadata"]["name"]
        raise InvalidJob(
            f"ddpjob {name} has no checkpoint volume (spec.checkpoint), so it keeps no {keeps}"
        )
    return CheckpointSpec.model_validate(raw).path


def metrics_path(job: Mapping[str, Any]) -> str:
    """Where metrics.jsonl is in the job's pods; raises InvalidJob without a checkpoint volume."""
    return posixpath.join(checkpoint_path(job, "metrics.jsonl to read"), RUN_LOG_FILE)


def metrics_reader_pod(job: Mapping[str, Any], image: str) -> dict[str, Any]:
    """A pod that prints the job's metrics.jsonl and exits (:func:`volume_reader_pod`)."""
    command = ["cat", metrics_path(job)]
    return volume_reader_pod(job, image, READER_CONTAINER, command, "plot", "64Mi")


def logs_reader_pod(job: Mapping[str, Any], image: str, budget: int) -> dict[str, Any]:
    """A pod that prints the logs the job's nodes kept (``<checkpoint path>/logs/``), at most
    ``budget`` bytes, and exits: :mod:`ddp_client.log_dump` run by the image's ``python``
    (:func:`volume_reader_pod`). Only pods that run the bundled trainer's node wrapper keep
    logs, so the job's image has a ``python``."""
    folder = posixpath.join(checkpoint_path(job, "logs to read"), LOGS_DIR)
    prefix = worker_name(job["metadata"]["name"], 0)[:-1]
    command = ["python", "-c", log_dump_source(), folder, prefix, str(budget)]
    return volume_reader_pod(job, image, LOGS_READER_CONTAINER, command, "logs", "256Mi")


def log_dump_source() -> str:
    """The source of :mod:`ddp_client.log_dump`, which the reader pod runs."""
    from . import log_dump

    return inspect.getsource(log_dump)


def volume_reader_pod(
    job: Mapping[str, Any],
    image: str,
    container_name: str,
    command: list[str],
    purpose: str,
    memory: str,
) -> dict[str, Any]:
    """A pod that runs ``command`` and exits, its output read through its log: the job's
    checkpoint volume mounted read-only where its pods mount it, the restricted security
    context, owned by the job, named ``<job>-<purpose>-``. It carries none of the job's labels:
    the operator would count it among the job's pods. It may run where the job's pods may
    (their node selector, tolerations, affinity, pull secrets)."""
    meta, spec = job["metadata"], job.get("spec") or {}
    checkpoint = CheckpointSpec.model_validate(spec["checkpoint"])
    template = spec.get("template") or {}
    container: dict[str, Any] = {
        "name": container_name,
        "image": image,
        "command": command,
        "volumeMounts": [{"name": "checkpoints", "mountPath": checkpoint.path, "readOnly": True}],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": memory}},
        "securityContext": {**RESTRICTED_CONTAINER, "readOnlyRootFilesystem": True},
    }
    if spec.get("imagePullPolicy"):
        container["imagePullPolicy"] = spec["imagePullPolicy"]
    pod_security = {k: v for k, v in RESTRICTED_POD.items() if k != "fsGroup"}  # reads only
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "activeDeadlineSeconds": READER_DEADLINE_S,
        "terminationGracePeriodSeconds": 1,
        "securityContext": pod_security,
        "containers": [container],
        "volumes": [{"name": "checkpoints", **checkpoint.volume}],
    }
    for key in ("nodeSelector", "tolerations", "affinity", "imagePullSecrets"):
        if template.get(key):
            pod_spec[key] = template[key]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            # <= 50 + 6 + 5 characters: the API server appends five.
            "generateName": f"{meta['name']}-{purpose}-",
            "namespace": meta.get("namespace", "default"),
            "labels": dict(MANAGED_BY),
            "ownerReferences": [owner_reference(meta, controller=False)],
        },
        "spec": pod_spec,
    }
