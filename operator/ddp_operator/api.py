"""The DDPJob API (ddp.dev/v1alpha1), declared once: every field's description, default, bounds
and CEL rule sits next to it, and the CRD in ``manifests/crd/`` is generated from these models.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonDict

from ddp_trainer.config import BUILTIN_WORKLOADS, PLUGIN_PATTERN, TrainerConfig

GROUP = "ddp.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "DDPJob"
PLURAL = "ddpjobs"
SINGULAR = "ddpjob"
SHORT_NAMES = ["ddpj"]
# `kubectl get ddp` lists every kind of this project; DDPJobs stay out of `all` (see docs/api.md).
CATEGORIES = ["ddp"]

# Pods are named `<name>-node-<index>` and Services `<name>` and `<name>-rdzv`; all of them must
# be DNS-1035 labels of at most 63 characters, which leaves 50 for the job's own name.
MAX_NAME_LENGTH = 50
DNS_1035_LABEL = "^[a-z]([-a-z0-9]*[a-z0-9])?$"


def cel(
    rule: str,
    message: str = "",
    *,
    message_expression: str = "",
    field_path: str = "",
    reason: str = "",
) -> JsonDict:
    """One `x-kubernetes-validations` entry: a CEL rule the API server checks on every write."""
    entry: JsonDict = {"rule": rule}
    if message:
        entry["message"] = message
    if message_expression:
        entry["messageExpression"] = message_expression
    if field_path:
        entry["fieldPath"] = field_path
    if reason:
        entry["reason"] = reason
    return entry


def _immutable(field: str) -> JsonDict:
    """Refuses changing, adding or removing an optional ``spec`` field once the job exists."""
    return cel(
        f"has(self.{field}) == has(oldSelf.{field})"
        f" && (!has(self.{field}) || self.{field} == oldSelf.{field})",
        f"spec.{field} is immutable: changing it would change the running pods;"
        " create a new DDPJob instead",
        field_path=f".{field}",
    )


# Core Kubernetes types (volume sources, tolerations, env vars...) are kept as objects the API
# server stores as given: their own API validates them when the operator creates the pod.
KubeObject = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]
# A resource quantity such as 2, "500m" or "16Gi".
Quantity = Annotated[
    StrictInt | Annotated[str, Field(max_length=64)],
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "maxLength": 64,
            "x-kubernetes-validations": [
                cel(
                    "type(self) == int ? self >= 0 : isQuantity(self)",
                    "must be a quantity such as 2, 500m or 16Gi",
                )
            ],
        }
    ),
]
NprocPerNode = Annotated[
    Annotated[StrictInt, Field(ge=1)] | Literal["auto"],
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "x-kubernetes-validations": [
                cel(
                    "type(self) == int ? self >= 1 : self == 'auto'",
                    message_expression=(
                        '\'spec.nprocPerNode must be an integer >= 1 or the string "auto",'
                        " not %s'.format([type(self) == int ? self : '\"' + self + '\"'])"
                    ),
                )
            ],
        }
    ),
]

# Bounds that keep the cost of the CEL rules (which compare whole sub-objects) within the
# API server's budget; generous for any real job.
MAX_LIST = 64
MAX_ARGS = 256
MAX_STRING = 4096
MAX_MAP = 64
ShortString = Annotated[str, Field(max_length=253)]
Arg = Annotated[str, Field(max_length=MAX_STRING)]


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
    )


class ImagePullPolicy(StrEnum):
    """When the kubelet pulls the image."""

    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


class RestartPolicy(StrEnum):
    """What the operator does when a node's pod fails."""

    ON_FAILURE = "OnFailure"
    EXIT_CODE = "ExitCode"
    NEVER = "Never"


class DDPJobPhase(StrEnum):
    """Where the job is in its life."""

    PENDING = "Pending"
    RUNNING = "Running"
    SCALING = "Scaling"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"


class ConditionStatus(StrEnum):
    """Whether a condition holds."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ResourceClaim(_Model):
    """A dynamic resource claim of the pod that the container uses."""

    name: ShortString = Field(
        description="Name of an entry in the pod's spec.resourceClaims that the container uses."
    )
    request: ShortString | None = Field(
        default=None,
        description="The request of that claim the container uses; empty means all of them.",
    )


class ResourceRequirements(_Model):
    """Compute resources of each node's training container (core/v1 ResourceRequirements)."""

    limits: dict[str, Quantity] | None = Field(
        default=None,
        max_length=MAX_MAP,
        description="Most of each resource the container may use, e.g."
        " {cpu: 8, memory: 32Gi, nvidia.com/gpu: 4}.",
    )
    requests: dict[str, Quantity] | None = Field(
        default=None,
        max_length=MAX_MAP,
        description="Resources the scheduler reserves for the container; default: the limits.",
    )
    claims: list[ResourceClaim] | None = Field(
        default=None,
        max_length=16,
        description="Dynamic resource claims (DRA) the container uses.",
    )


class CheckpointSpec(_Model):
    """Where and how often the training state is saved; every start resumes from the newest."""

    volume: KubeObject = Field(
        description="A core/v1 volume source shared by all nodes that holds the checkpoints,"
        " e.g. {persistentVolumeClaim: {claimName: ckpt}}. Required.",
    )
    path: str = Field(
        default="/checkpoints",
        max_length=MAX_STRING,
        pattern="^/",
        description="Absolute path where the volume is mounted in each pod. Default: /checkpoints.",
    )
    every_steps: int = Field(
        default=100,
        ge=1,
        description="Optimizer steps between checkpoints; one is also written on SIGTERM when"
        " the grace period allows. At least 1; default: 100.",
    )
    keep: int = Field(
        default=3,
        ge=1,
        description="Newest complete checkpoints kept; older ones are deleted. At least 1;"
        " default: 3.",
    )


class PodMetadata(_Model):
    """Labels and annotations added to every pod of the job."""

    labels: dict[str, ShortString] | None = Field(
        default=None, max_length=MAX_MAP, description="Labels added to every pod."
    )
    annotations: dict[str, Annotated[str, Field(max_length=MAX_STRING)]] | None = Field(
        default=None, max_length=MAX_MAP, description="Annotations added to every pod."
    )


class LocalObjectReference(_Model):
    """A reference to an object in the job's namespace."""

    name: ShortString = Field(description="Name of the object, e.g. a docker-registry Secret.")


class PodTemplateOverrides(_Model):
    """Pod settings added to every node's pod; the operator owns the rest of the pod."""

    metadata: PodMetadata | None = Field(
        default=None, description="Labels and annotations added to every pod."
    )
    node_selector: dict[str, ShortString] | None = Field(
        default=None,
        max_length=MAX_MAP,
        description="Node labels a node must have to run the job's pods.",
    )
    tolerations: list[KubeObject] | None = Field(
        default=None,
        max_length=MAX_LIST,
        description="core/v1 Tolerations of the pods, e.g. for tainted GPU nodes.",
    )
    affinity: KubeObject | None = Field(default=None, description="core/v1 Affinity of the pods.")
    env: list[KubeObject] | None = Field(
        default=None,
        max_length=MAX_ARGS,
        description="core/v1 EnvVars added to the training container. Names the operator sets"
        " (PET_*, DDPJOB_*) are reserved.",
    )
    volumes: list[KubeObject] | None = Field(
        default=None,
        max_length=MAX_LIST,
        description="core/v1 Volumes added to the pods; mount them with volumeMounts.",
    )
    volume_mounts: list[KubeObject] | None = Field(
        default=None,
        max_length=MAX_LIST,
        description="core/v1 VolumeMounts added to the training container.",
    )
    image_pull_secrets: list[LocalObjectReference] | None = Field(
        default=None,
        max_length=16,
        description="Secrets used to pull the image from a private registry.",
    )
    service_account_name: ShortString | None = Field(
        default=None,
        description="ServiceAccount the pods run as. Default: the namespace's default account.",
    )
    priority_class_name: ShortString | None = Field(
        default=None, description="PriorityClass of the pods."
    )
    scheduler_name: ShortString | None = Field(
        default=None,
        description="Scheduler that places the pods, e.g. a gang scheduler. Default: the"
        " cluster's default scheduler.",
    )


SPEC_IMMUTABLE_FIELDS = (
    "minNodes",
    "maxNodes",
    "nprocPerNode",
    "image",
    "imagePullPolicy",
    "trainer",
    "command",
    "args",
    "resources",
    "checkpoint",
    "template",
    "workerRestarts",
)


class DDPJobSpec(_Model):
    """What the user asks for: how many nodes, what each runs, and how failures are handled."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.minNodes) == has(self.maxNodes)",
                    "spec.minNodes and spec.maxNodes go together: set both to make the job"
                    " elastic, or neither for a fixed size",
                    field_path=".minNodes",
                ),
                cel(
                    "!has(self.minNodes) || !has(self.maxNodes) || self.minNodes <= self.maxNodes",
                    message_expression=(
                        "'spec.minNodes (%d) must not exceed spec.maxNodes (%d)'"
                        ".format([self.minNodes, self.maxNodes])"
                    ),
                    field_path=".minNodes",
                ),
                cel(
                    "!has(self.minNodes) || !has(self.maxNodes)"
                    " || (self.nodes >= self.minNodes && self.nodes <= self.maxNodes)",
                    message_expression=(
                        "'spec.nodes (%d) must be within [spec.minNodes, spec.maxNodes] = [%d, %d]'"
                        ".format([self.nodes, self.minNodes, self.maxNodes])"
                    ),
                    field_path=".nodes",
                ),
                cel(
                    "has(self.maxNodes) || self.nodes == oldSelf.nodes",
                    "spec.nodes cannot change on a job that is not elastic: set spec.minNodes"
                    " and spec.maxNodes (in a new DDPJob) to make the job elastic",
                    field_path=".nodes",
                ),
                cel(
                    "!has(self.trainer) || !has(self.command)",
                    "spec.trainer and spec.command are mutually exclusive: set trainer to run"
                    " the bundled trainer, or command to run your own program",
                    field_path=".command",
                ),
                cel(
                    "!has(self.trainer) || !has(self.trainer.workload)"
                    f" || self.trainer.workload in {list(BUILTIN_WORKLOADS)}"
                    f" || self.trainer.workload.matches(r'{PLUGIN_PATTERN.pattern}')",
                    "spec.trainer.workload must be one of"
                    f" {', '.join(BUILTIN_WORKLOADS)}, or a plugin package.module:function",
                    field_path=".trainer.workload",
                ),
                *(_immutable(f) for f in SPEC_IMMUTABLE_FIELDS),
            ]
        }
    )

    nodes: int = Field(
        default=1,
        ge=1,
        description="Desired number of nodes (pods), each running torchrun with nprocPerNode"
        " workers. `kubectl scale ddpjob/NAME --replicas N` sets it. Must stay within"
        " [minNodes, maxNodes] when those are set, and cannot change when they are not."
        " At least 1; default: 1.",
    )
    min_nodes: int | None = Field(
        default=None,
        ge=1,
        description="Fewest nodes the job keeps training with (torchrun --nnodes=minNodes:"
        "maxNodes). Set together with maxNodes to make the job elastic; when both are unset"
        " they equal nodes and the job is not elastic. At least 1. Immutable.",
    )
    max_nodes: int | None = Field(
        default=None,
        ge=1,
        description="Most nodes the job can be scaled to (torchrun --nnodes=minNodes:maxNodes)."
        " Set together with minNodes; at least minNodes. Immutable.",
    )
    nproc_per_node: NprocPerNode = Field(
        default=1,
        description="Worker processes per node (torchrun --nproc-per-node): an integer >= 1,"
        ' or "auto" for one per GPU (one in total without GPUs). Default: 1. Immutable.',
    )
    image: str | None = Field(
        default=None,
        max_length=MAX_STRING,
        description="Container image of the nodes. Default: the trainer image configured in the"
        " operator. Immutable.",
    )
    image_pull_policy: ImagePullPolicy | None = Field(
        default=None,
        description="When to pull the image: Always, IfNotPresent or Never. Default: the"
        " Kubernetes default for the image's tag. Immutable.",
    )
    trainer: TrainerConfig | None = Field(
        default=None,
        description="Settings of the bundled trainer, which runs when command is unset."
        " Mutually exclusive with command. Immutable.",
    )
    command: list[Arg] | None = Field(
        default=None,
        max_length=MAX_ARGS,
        description="Program each node runs instead of the bundled trainer, e.g."
        " [torchrun, /scripts/train.py]; torchrun's flags come from the PET_* environment the"
        " operator sets. Mutually exclusive with trainer. Immutable.",
    )
    args: list[Arg] | None = Field(
        default=None,
        max_length=MAX_ARGS,
        description="Arguments appended to command, or to the bundled trainer when command is"
        " unset. Immutable.",
    )
    resources: ResourceRequirements | None = Field(
        default=None,
        description="Compute resources of each node's training container (core/v1"
        " ResourceRequirements: limits, requests, claims). Immutable.",
    )
    checkpoint: CheckpointSpec | None = Field(
        default=None,
        description="Where and how often training state is saved. Without it nothing is"
        " saved, and a restarted node starts training from the beginning. Immutable.",
    )
    restart_policy: RestartPolicy = Field(
        default=RestartPolicy.ON_FAILURE,
        description="What happens when a node's pod fails: OnFailure recreates it; ExitCode"
        " treats exit codes 1-127 as permanent failures and retries 128 and above (signals,"
        " e.g. OOM kills and preemption); Never fails the job. Default: OnFailure.",
    )
    backoff_limit: int = Field(
        default=3,
        ge=0,
        description="Pod failures (recreations) the job tolerates before it is Failed."
        " At least 0; default: 3.",
    )
    worker_restarts: int = Field(
        default=3,
        ge=0,
        description="Times torchrun restarts the workers inside one pod before the pod fails"
        " (torchrun --max-restarts). At least 0; default: 3. Immutable.",
    )
    active_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        description="Seconds after the job starts before it is stopped and Failed, whatever"
        " its progress. At least 1; default: no deadline.",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        description="Seconds after the job Succeeded or Failed before it is deleted with its"
        " pods. At least 0; default: never deleted.",
    )
    suspend: bool = Field(
        default=False,
        description="true deletes the job's pods (rank 0 checkpoints first) and keeps the job;"
        " false again resumes it from the newest checkpoint. Default: false.",
    )
    template: PodTemplateOverrides | None = Field(
        default=None,
        description="Pod settings added to every node's pod: labels, scheduling, env,"
        " volumes, pull secrets, service account. Immutable.",
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        """The rules above that need no previous version (the API server checks them too)."""
        if (self.min_nodes is None) != (self.max_nodes is None):
            raise ValueError(
                "spec.minNodes and spec.maxNodes go together: set both to make the job"
                " elastic, or neither for a fixed size"
            )
        if self.min_nodes is not None and self.max_nodes is not None:
            if self.min_nodes > self.max_nodes:
                raise ValueError(
                    f"spec.minNodes ({self.min_nodes}) must not exceed"
                    f" spec.maxNodes ({self.max_nodes})"
                )
            if not self.min_nodes <= self.nodes <= self.max_nodes:
                raise ValueError(
                    f"spec.nodes ({self.nodes}) must be within [spec.minNodes, spec.maxNodes]"
                    f" = [{self.min_nodes}, {self.max_nodes}]"
                )
        if self.trainer is not None and self.command is not None:
            raise ValueError("spec.trainer and spec.command are mutually exclusive")
        return self

    @property
    def elastic(self) -> bool:
        return self.max_nodes is not None

    def node_range(self) -> tuple[int, int]:
        """torchrun's --nnodes bounds: (minNodes, maxNodes), or (nodes, nodes) when not elastic."""
        if self.min_nodes is None or self.max_nodes is None:
            return self.nodes, self.nodes
        return self.min_nodes, self.max_nodes


class Condition(_Model):
    """One aspect of the job's state (like metav1.Condition)."""

    type: ShortString = Field(
        description="What the condition is about, e.g. Ready, Succeeded, Failed, Suspended."
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: ShortString | None = Field(
        default=None, description="Why, as one CamelCase word, e.g. BackoffLimitExceeded."
    )
    message: Annotated[str, Field(max_length=32768)] | None = Field(
        default=None, description="Why, in a sentence for a human."
    )
    last_transition_time: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When status last changed (RFC 3339).",
    )


class Progress(_Model):
    """Training progress reported by global rank 0."""

    epoch: int | None = Field(default=None, description="Current epoch, from 0.")
    step: int | None = Field(default=None, description="Optimizer steps done so far.")
    total_steps: int | None = Field(default=None, description="Optimizer steps of the whole run.")
    loss: float | None = Field(default=None, description="Latest training loss.")
    samples_per_second: float | None = Field(
        default=None, description="Training throughput over all workers."
    )
    last_checkpoint: str | None = Field(
        default=None, description="Path of the newest complete checkpoint."
    )
    updated_at: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When rank 0 last reported (RFC 3339).",
    )
    world_size: int | None = Field(
        default=None, description="Workers (ranks) in the group that made this report."
    )


class DDPJobStatus(_Model):
    """What the operator observed; written only by the operator."""

    phase: DDPJobPhase | None = Field(
        default=None,
        description="Pending, Running, Scaling, Restarting, Succeeded, Failed or Suspended.",
    )
    conditions: list[Condition] | None = Field(
        default=None,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
        description="Conditions of the job, at most one per type, with reasons.",
    )
    nodes: int | None = Field(default=None, description="Node pods that exist.")
    ready_nodes: int | None = Field(default=None, description="Node pods that are Ready.")
    ready: str | None = Field(
        default=None, description="readyNodes/nodes as text, e.g. 2/3, for `kubectl get`."
    )
    selector: str | None = Field(
        default=None,
        description="Label selector of the job's node pods (for the scale subresource).",
    )
    restarts: int | None = Field(default=None, description="Pods recreated after a failure so far.")
    world_size: int | None = Field(
        default=None, description="Workers (ranks) of the current rendezvous."
    )
    start_time: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When the operator first created pods (RFC 3339).",
    )
    completion_time: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When the job Succeeded or Failed (RFC 3339).",
    )
    observed_generation: int | None = Field(
        default=None, description="metadata.generation of the spec this status describes."
    )
    progress: Progress | None = Field(
        default=None, description="Training progress reported by global rank 0."
    )
    last_failure_time: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When the operator last counted a failed or disrupted pod (RFC 3339); the"
        " restart backoff counts from it.",
    )
    handled_failures: list[Annotated[str, Field(max_length=64)]] | None = Field(
        default=None,
        max_length=64,
        description="uids of the newest pods already counted as failures or deleted by the"
        " operator, so that none is counted twice (bookkeeping of the operator).",
    )


class DDPJob(_Model):
    """Runs PyTorch DistributedDataParallel training on `nodes` pods with torchrun; elastic
    between minNodes and maxNodes, resumed from checkpoints after failures."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"self.metadata.name.size() <= {MAX_NAME_LENGTH}",
                    message_expression=(
                        f"'metadata.name must be at most {MAX_NAME_LENGTH} characters, not %d:"
                        " pods are named <name>-node-<index> and Services <name>-rdzv, which"
                        " must be at most 63'.format([self.metadata.name.size()])"
                    ),
                ),
                cel(
                    f"self.metadata.name.matches('{DNS_1035_LABEL}')",
                    "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-',"
                    " starting with a letter): it names the job's Services",
                ),
            ]
        }
    )

    api_version: Literal["ddp.dev/v1alpha1"] = Field(
        default="ddp.dev/v1alpha1", description="ddp.dev/v1alpha1"
    )
    kind: Literal["DDPJob"] = Field(default="DDPJob", description="DDPJob")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: DDPJobSpec = Field(description="What the job should run.")
    status: DDPJobStatus | None = Field(
        default=None, description="What the operator observed. Written by the operator."
    )

    @model_validator(mode="after")
    def _check_name(self) -> Self:
        name = self.metadata.get("name")
        if isinstance(name, str) and len(name) > MAX_NAME_LENGTH:
            raise ValueError(
                f"metadata.name must be at most {MAX_NAME_LENGTH} characters, not {len(name)}"
            )
        return self
