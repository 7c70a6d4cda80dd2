"""The DDPJob API (ddp.dev/v1alpha1), declared once: every field's description, default, bounds
and CEL rule sits next to it, and the CRD in ``manifests/crd/`` is generated from these models.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self, TypeAlias

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

from . import contract
from .contract import API_VERSION, FAULT_TOLERANCE_PER_STEP, FAULT_TOLERANCE_RESTART, KIND
from .trainer_config import BUILTIN_WORKLOADS, PLUGIN_PATTERN, TrainerConfig

# What ``apiVersion`` and ``kind`` accept: the contract's values and nothing else. pydantic reads
# the Literal; mypy cannot take a Literal of a name (only of a value written out), so it sees str.
if TYPE_CHECKING:
    ApiVersion: TypeAlias = str
    Kind: TypeAlias = str
else:
    ApiVersion, Kind = Literal[API_VERSION], Literal[KIND]
SINGULAR = "ddpjob"
SHORT_NAMES = ["ddpj"]
# `kubectl get ddp` lists every kind of this project; DDPJobs stay out of `all` (see docs/api.md).
CATEGORIES = ["ddp"]

# Pods are named `<name>-node-<index>` and Services `<name>`, `<name>-rdzv` and (PerStep)
# `<name>-lighthouse`; all of them must be DNS-1035 labels of at most 63 characters, which leaves
# 50 for the job's own name.
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


# Marks a spec field immutable: the only place that says so. The CRD gets its CEL rule and the
# sentence "Immutable." at the end of its description from this marker.
IMMUTABLE_KEY = "x-ddp-immutable"
IMMUTABLE: JsonDict = {IMMUTABLE_KEY: True}
IMMUTABLE_NOTE = " Immutable."


@dataclass(frozen=True)
class SpecRule:
    """A rule on ``spec``, declared once: the API server checks ``cel`` on every write; the
    operator checks ``holds`` (None: the rule compares with the previous version, which only
    the API server has). ``message`` is a template over the spec's camelCase fields, e.g.
    ``{nodes:d}``; it becomes the rule's messageExpression."""

    cel: str
    holds: Callable[[Any], bool] | None
    message: str
    field: str

    def entry(self) -> JsonDict:
        names = [name for name, _ in re.findall(_PLACEHOLDER, self.message)]
        if not names:
            return cel(self.cel, self.message, field_path=f".{self.field}")
        text = re.sub(_PLACEHOLDER, lambda m: "%d" if m.group(2) else "%s", self.message)
        args = ", ".join(f"self.{n}" for n in names)
        return cel(
            self.cel, message_expression=f"'{text}'.format([{args}])", field_path=f".{self.field}"
        )

    def violated_by(self, values: dict[str, Any]) -> str | None:
        """The message when ``values`` (the spec's camelCase dump) break the rule."""
        if self.holds is None or self.holds(values):
            return None
        return re.sub(_PLACEHOLDER, lambda m: str(_lookup(values, m.group(1))), self.message)


# A field of the spec in a SpecRule's message, e.g. {nodes:d} or {faultTolerance.minGroups:d}.
_PLACEHOLDER = r"\{([\w.]+)(:d)?\}"


def _lookup(values: dict[str, Any], path: str) -> Any:
    """The value at a dotted camelCase ``path`` of the spec's dump."""
    value: Any = values
    for part in path.split("."):
        value = value[part]
    return value


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
MAX_HANDLED = 4096  # status.handledFailures: a job's pods that are going, and then some
MAX_ARGS = 256
MAX_STRING = 4096
MAX_MAP = 64
MAX_SPREAD_CONSTRAINTS = 8  # one per topology key (hostname, zone, rack...) is the usual use
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


class Spread(StrEnum):
    """How a job's node pods spread across machines (nodes by ``kubernetes.io/hostname``)."""

    REQUIRED = "Required"
    PREFERRED = "Preferred"
    NONE = "None"


class DDPJobPhase(StrEnum):
    """Where the job is in its life."""

    PENDING = "Pending"
    RUNNING = "Running"
    SCALING = "Scaling"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"
    QUEUED = "Queued"  # waiting for Kueue to admit it (or to admit it again after an eviction)


# The phases a job never leaves. A pod's phase ends in the same two words (core/v1 PodPhase), so
# ``pod_phase in TERMINAL_PHASES`` also says whether a pod is done.
TERMINAL_PHASES = (DDPJobPhase.SUCCEEDED, DDPJobPhase.FAILED)


class ConditionStatus(StrEnum):
    """Whether a condition holds."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class EventType(StrEnum):
    """The type of an Event the operator records about a job (core/v1 Event ``type``)."""

    NORMAL = "Normal"
    WARNING = "Warning"


class Reason(StrEnum):
    """The reasons the operator gives, in the job's condition (``status.reason``) and in its
    Events, beside those of a pod's problem (:class:`ProblemReason`) and Kueue's own."""

    WAITING_FOR_NODES = "WaitingForNodes"  # Pending: the node pods start
    POD_NAME_TAKEN = "PodNameTaken"  # a pod no DDPJob controls has the name of one to create
    ALL_NODES_RUNNING = "AllNodesRunning"
    NODES_NOT_READY = "NodesNotReady"  # Running: every pod there, not all ready for a moment
    NODES_CHANGING = "NodesChanging"  # Scaling
    GROUPS_CHANGING = "GroupsChanging"  # PerStep: enough groups train while others come or go
    NODES_COMPLETING = "NodesCompleting"  # one node finished training; the others get a grace
    COMPLETED = "Completed"
    # A restart counted against backoffLimit: a pod that failed, or one deleted while it ran.
    # The operator's restarts metric counts the Events of these two.
    POD_FAILED = "PodFailed"
    POD_DISRUPTED = "PodDisrupted"
    DISRUPTION = "Disruption"  # a pod Kubernetes took away (DisruptionTarget): not counted
    NODE_LOST = "NodeLost"  # a pod on a machine not Ready, or silent
    STORE_LOST = "StoreLost"
    LIGHTHOUSE_LOST = "LighthouseLost"
    LOST_AFTER_TRAINING = "LostAfterTraining"  # a node pod lost after the last step
    STALLED = "Stalled"  # no step for progressDeadlineSeconds
    BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
    DEADLINE_EXCEEDED = "DeadlineExceeded"  # activeDeadlineSeconds
    SUSPENDED = "Suspended"
    RESUMED = "Resumed"
    TTL_EXPIRED = "TTLExpired"  # an Event: ttlSecondsAfterFinished passed, the job is deleted
    INVALID_SPEC = "InvalidSpec"  # Failed: a spec this operator cannot read (a newer CRD's)
    # Kueue: the job waits in a LocalQueue, is admitted, evicted, or admitted again; "Admitted"
    # is also the type of the condition that says so.
    QUEUED = "Queued"
    ADMITTED = "Admitted"
    EVICTED = "Evicted"
    READMITTED = "Readmitted"
    # Events only: what a reconcile does or could not do.
    SCALING_DOWN = "ScalingDown"
    REBALANCING = "Rebalancing"  # PerStep: a group's pod deleted to go to a machine of its own
    CREATING_PODS = "CreatingPods"
    CHECKPOINT_CLAIM_SHARED = "CheckpointClaimShared"  # another live job checkpoints there too
    CREATE_FAILED = "CreateFailed"
    PROGRESS_REJECTED = "ProgressRejected"  # a progress report refused
    TRAINER_POLICY_MISSING = "TrainerPolicyMissing"  # the admission policy is not in force


class ProblemReason(StrEnum):
    """The reasons of a pod's problem, as the job's condition and Events say them
    (``ddp_operator.diagnosis``); a failure to start that none of these names keeps the
    kubelet's own reason (StartError, ContainerCannotRun)."""

    IMAGE_PULL_FAILED = "ImagePullFailed"
    CLAIM_NOT_FOUND = "ClaimNotFound"
    CONTAINER_CONFIG_ERROR = "ContainerConfigError"
    COMMAND_NOT_FOUND = "CommandNotFound"
    OOM_KILLED = "OOMKilled"
    UNSCHEDULABLE = "Unschedulable"
    INCOMPATIBLE_RESUME = contract.INCOMPATIBLE_RESUME  # the trainer's refusal to resume
    SYNTAX_ERROR = "SyntaxError"  # the program does not compile (contract.SYNTAX_ERRORS)
    SERVER_FAILING = "ServerFailing"  # the store or lighthouse exits again and again


class IncidentKind(StrEnum):
    """What stopped training (``status.incidents[].kind``)."""

    FAILURE = "Failure"
    DISRUPTION = "Disruption"
    NODE_LOST = "NodeLost"
    STALLED = "Stalled"
    STORE_LOST = "StoreLost"
    LIGHTHOUSE_LOST = "LighthouseLost"
    RESIZE = "Resize"
    # PerStep: the operator moved a group sharing a machine to one that has none (placement)
    REBALANCE = "Rebalance"


# The Events of a restart counted against backoffLimit.
RESTART_REASONS = frozenset({Reason.POD_FAILED, Reason.POD_DISRUPTED})


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
        ge=0,
        description="Optimizer steps between checkpoints (the trainer's checkpointEverySteps);"
        " one is also written at the end and on SIGTERM when the grace period allows. 0: only"
        " those. At least 0; default: 100.",
    )
    keep: int = Field(
        default=3,
        ge=1,
        description="Newest complete checkpoints kept (the trainer's checkpointKeep); older ones"
        " are deleted. At least 1; default: 3.",
    )


MOVED_TO_CHECKPOINT = {"checkpointEverySteps": "everySteps", "checkpointKeep": "keep"}


class TrainerSettings(TrainerConfig):
    """Settings of the bundled trainer (`python -m ddp_trainer --help`), except where the
    checkpoints go and how often: in a DDPJob that is spec.checkpoint, the one knob for it.
    The two moved fields are widened to accept None (their only allowed value) on purpose."""

    checkpoint_every_steps: int | None = Field(  # type: ignore[assignment]
        default=None,
        description="Moved: set spec.checkpoint.everySteps. A value here is refused.",
    )
    checkpoint_keep: int | None = Field(  # type: ignore[assignment]
        default=None, description="Moved: set spec.checkpoint.keep. A value here is refused."
    )


def _moved_message(name: str) -> str:
    return (
        f"spec.trainer.{name} is set by spec.checkpoint.{MOVED_TO_CHECKPOINT[name]} in a"
        " DDPJob: move it there"
    )


class FaultToleranceMode(StrEnum):
    """How a job rides through a lost node (``spec.faultTolerance.mode``)."""

    RESTART = FAULT_TOLERANCE_RESTART
    PER_STEP = FAULT_TOLERANCE_PER_STEP


DEFAULT_MIN_GROUPS = 1
DEFAULT_GROUP_TIMEOUT_S = 5
MAX_GROUP_TIMEOUT_S = 600


class FaultTolerance(_Model):
    """How the job rides through a lost, deleted or failed node pod."""

    mode: FaultToleranceMode = Field(
        default=FaultToleranceMode.RESTART,
        description="Restart: one torchrun rendezvous over all node pods; a lost pod stops"
        " every worker, which rendezvous again and resume from the newest checkpoint."
        " PerStep: each node pod is a replica group of its own (torchft): a job-wide"
        " lighthouse pod forms a quorum for every step, a lost pod is replaced alone while"
        " the other groups keep training, and a new group heals from a live one;"
        " `kubectl scale` adds or removes groups without restarting the others. The program"
        " must use torchft (the bundled trainer does; docs/api.md shows the lines a script"
        " adds). Default: Restart.",
    )
    min_groups: int | None = Field(
        default=None,
        ge=1,
        description="PerStep only: the fewest replica groups (node pods) that may train a"
        " step; with fewer the groups wait (the lighthouse's --min_replicas). At most"
        " spec.minNodes (spec.nodes when not elastic). At least 1; default: 1.",
    )
    group_timeout_seconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_GROUP_TIMEOUT_S,
        description="PerStep only: seconds a replica group may go without a heartbeat before"
        " the lighthouse drops it from the quorum and the others go on without it (the"
        " lighthouse's --heartbeat_timeout_ms); also how long a step's collective waits for a"
        " lost peer. A group waits for a quorum up to 3 times this (at least 10 s) before it"
        " tries again, and notices SIGTERM only then: node pods get that much more"
        " terminationGracePeriodSeconds, so the group that saves the last step can."
        f" 1 to {MAX_GROUP_TIMEOUT_S}; default: {DEFAULT_GROUP_TIMEOUT_S}.",
    )

    @property
    def per_step(self) -> bool:
        return self.mode == FaultToleranceMode.PER_STEP

    @property
    def groups_min(self) -> int:
        return DEFAULT_MIN_GROUPS if self.min_groups is None else self.min_groups

    @property
    def group_timeout_s(self) -> int:
        t = self.group_timeout_seconds
        return DEFAULT_GROUP_TIMEOUT_S if t is None else t


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


MAX_TERMINATION_GRACE_S = 86400


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
    topology_spread_constraints: list[KubeObject] | None = Field(
        default=None,
        max_length=MAX_SPREAD_CONSTRAINTS,
        description="core/v1 TopologySpreadConstraints of the node pods (not the rendezvous"
        " store pod's), e.g. across zones. One on kubernetes.io/hostname replaces the one"
        " spec.spread adds.",
    )
    env: list[KubeObject] | None = Field(
        default=None,
        max_length=MAX_ARGS,
        description="core/v1 EnvVars added to the training container. Names the operator sets"
        " (PET_*, DDPJOB_*) are reserved. A RUST_LOG here is also a PerStep job's lighthouse"
        " log level (default warn).",
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
    termination_grace_period_seconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TERMINATION_GRACE_S,
        description="Seconds a node pod has after SIGTERM (a suspend, a deletion, a drain, a"
        " scale-down) before it is killed. The bundled trainer stops after the step it is in"
        " and checkpoints that step, so give it what a step and a synchronous checkpoint write"
        " take. PerStep mode adds one quorum try (3 x faultTolerance.groupTimeoutSeconds, at"
        f" least 10 s). 1 to {MAX_TERMINATION_GRACE_S}; default: the operator's, 60.",
    )


def _trainer_lacks(name: str) -> Callable[[dict[str, Any]], bool]:
    return lambda v: (v.get("trainer") or {}).get(name) is None


DEFAULT_GLOBAL_BATCH = TrainerConfig.model_fields["global_batch_size"].default


def _ranks_fit_the_batch(v: dict[str, Any]) -> bool:
    """The bundled trainer's processes at the job's largest size each get a sample per step
    (a job running its own command, or with nprocPerNode auto, is not checked)."""
    nproc = v.get("nprocPerNode")
    if v.get("command") is not None or not isinstance(nproc, int):
        return True
    nodes = v.get("maxNodes") or v.get("nodes") or 1
    batch = (v.get("trainer") or {}).get("globalBatchSize") or DEFAULT_GLOBAL_BATCH
    return bool(nodes * nproc <= batch)


def _both_or_neither(v: dict[str, Any]) -> bool:
    return (v.get("minNodes") is None) == (v.get("maxNodes") is None)


def _fault_tolerance(v: dict[str, Any]) -> dict[str, Any]:
    return v.get("faultTolerance") or {}


def _elastic(v: dict[str, Any]) -> bool:
    return v.get("minNodes") is not None and v.get("maxNodes") is not None


SPEC_RULES = (
    SpecRule(
        "has(self.minNodes) == has(self.maxNodes)",
        _both_or_neither,
        "spec.minNodes and spec.maxNodes go together: set both to make the job elastic, or"
        " neither for a fixed size",
        "minNodes",
    ),
    SpecRule(
        "!has(self.minNodes) || !has(self.maxNodes) || self.minNodes <= self.maxNodes",
        lambda v: not _elastic(v) or v["minNodes"] <= v["maxNodes"],
        "spec.minNodes ({minNodes:d}) must not exceed spec.maxNodes ({maxNodes:d})",
        "minNodes",
    ),
    SpecRule(
        "!has(self.minNodes) || !has(self.maxNodes)"
        " || (self.nodes >= self.minNodes && self.nodes <= self.maxNodes)",
        lambda v: not _elastic(v) or v["minNodes"] <= v["nodes"] <= v["maxNodes"],
        "spec.nodes ({nodes:d}) must be within [spec.minNodes, spec.maxNodes] ="
        " [{minNodes:d}, {maxNodes:d}]",
        "nodes",
    ),
    SpecRule(
        "has(self.maxNodes) || self.nodes == oldSelf.nodes",
        None,
        "spec.nodes cannot change on a job that is not elastic: set spec.minNodes and"
        " spec.maxNodes (in a new DDPJob) to make the job elastic",
        "nodes",
    ),
    SpecRule(
        "!has(self.trainer) || !has(self.command)",
        lambda v: v.get("trainer") is None or v.get("command") is None,
        "spec.trainer and spec.command are mutually exclusive: set trainer to run the bundled"
        " trainer, or command to run your own program",
        "command",
    ),
    SpecRule(  # pydantic checks it in TrainerConfig, with the same wording
        "!has(self.trainer) || !has(self.trainer.workload)"
        f" || self.trainer.workload in {list(BUILTIN_WORKLOADS)}"
        f" || self.trainer.workload.matches(r'{PLUGIN_PATTERN.pattern}')",
        None,
        f"spec.trainer.workload must be one of {', '.join(BUILTIN_WORKLOADS)}, or a plugin"
        " package.module:function",
        "trainer.workload",
    ),
    SpecRule(
        "has(self.command) || type(self.nprocPerNode) != int"
        " || (has(self.maxNodes) ? self.maxNodes : self.nodes) * self.nprocPerNode"
        " <= (has(self.trainer) && has(self.trainer.globalBatchSize)"
        f" ? self.trainer.globalBatchSize : {DEFAULT_GLOBAL_BATCH})",
        _ranks_fit_the_batch,
        "spec.maxNodes (spec.nodes when not elastic) x spec.nprocPerNode, the most processes"
        " the job trains with, must not exceed spec.trainer.globalBatchSize (default"
        f" {DEFAULT_GLOBAL_BATCH}): every process needs a sample per step. Lower spec.maxNodes"
        " or spec.nprocPerNode, or raise spec.trainer.globalBatchSize",
        "nprocPerNode",
    ),
    SpecRule(
        "!has(self.faultTolerance) || self.faultTolerance.mode == 'PerStep'"
        " || (!has(self.faultTolerance.minGroups)"
        " && !has(self.faultTolerance.groupTimeoutSeconds))",
        lambda v: (
            _fault_tolerance(v).get("mode") == FaultToleranceMode.PER_STEP
            or (
                _fault_tolerance(v).get("minGroups") is None
                and _fault_tolerance(v).get("groupTimeoutSeconds") is None
            )
        ),
        "spec.faultTolerance.minGroups and spec.faultTolerance.groupTimeoutSeconds apply to"
        " mode PerStep only: set spec.faultTolerance.mode to PerStep, or remove them",
        "faultTolerance",
    ),
    SpecRule(
        "!has(self.faultTolerance) || !has(self.faultTolerance.minGroups)"
        " || !has(self.minNodes) || self.faultTolerance.minGroups <= self.minNodes",
        lambda v: (
            _fault_tolerance(v).get("minGroups") is None
            or v.get("minNodes") is None
            or _fault_tolerance(v)["minGroups"] <= v["minNodes"]
        ),
        "spec.faultTolerance.minGroups ({faultTolerance.minGroups:d}) must not exceed"
        " spec.minNodes ({minNodes:d}): the job may run with minNodes replica groups (scaled"
        " down, or admitted so by Kueue), and then no step could train. Lower minGroups or"
        " raise minNodes",
        "faultTolerance.minGroups",
    ),
    SpecRule(
        "!has(self.faultTolerance) || !has(self.faultTolerance.minGroups)"
        " || has(self.minNodes) || self.faultTolerance.minGroups <= self.nodes",
        lambda v: (
            _fault_tolerance(v).get("minGroups") is None
            or v.get("minNodes") is not None
            or _fault_tolerance(v)["minGroups"] <= v["nodes"]
        ),
        "spec.faultTolerance.minGroups ({faultTolerance.minGroups:d}) must not exceed"
        " spec.nodes ({nodes:d}): each node pod is one replica group, so no step could"
        " train. Lower minGroups",
        "faultTolerance.minGroups",
    ),
    *(
        SpecRule(
            f"!has(self.trainer) || !has(self.trainer.{name})",
            _trainer_lacks(name),
            _moved_message(name),
            f"trainer.{name}",
        )
        for name in MOVED_TO_CHECKPOINT
    ),
)


def _spec_schema(schema: JsonDict, model: type) -> None:
    """The spec's CEL rules, from SPEC_RULES and the fields marked IMMUTABLE (which also get
    their description's last sentence here)."""
    immutable = []
    properties = schema["properties"]
    assert isinstance(properties, dict)
    for alias, prop in properties.items():
        if isinstance(prop, dict) and prop.pop(IMMUTABLE_KEY, False):
            prop["description"] = str(prop["description"]) + IMMUTABLE_NOTE
            immutable.append(alias)
    rules: list[JsonDict] = [rule.entry() for rule in SPEC_RULES]
    schema["x-kubernetes-validations"] = [*rules, *(_immutable(f) for f in immutable)]


class DDPJobSpec(_Model):
    """What the user asks for: how many nodes, what each runs, and how failures are handled."""

    model_config = ConfigDict(json_schema_extra=_spec_schema)

    nodes: int = Field(
        default=1,
        ge=1,
        description="Desired number of nodes (pods), each running torchrun with nprocPerNode"
        " workers. `kubectl scale ddpjob/NAME --replicas N` sets it. Must stay within"
        " [minNodes, maxNodes] when those are set, and cannot change when they are not."
        " At least 1; default: 1.",
    )
    min_nodes: int | None = Field(
        json_schema_extra=IMMUTABLE,
        default=None,
        ge=1,
        description="Fewest nodes the job keeps training with (torchrun --nnodes=minNodes:"
        "maxNodes). Set together with maxNodes to make the job elastic; when both are unset"
        " they equal nodes and the job is not elastic. At least 1.",
    )
    max_nodes: int | None = Field(
        json_schema_extra=IMMUTABLE,
        default=None,
        ge=1,
        description="Most nodes the job can be scaled to (torchrun --nnodes=minNodes:maxNodes)."
        " Set together with minNodes; at least minNodes.",
    )
    nproc_per_node: NprocPerNode = Field(
        json_schema_extra=IMMUTABLE,
        default=1,
        description="Worker processes per node (torchrun --nproc-per-node): an integer >= 1,"
        ' or "auto" for one per GPU (one in total without GPUs). Default: 1.',
    )
    image: str | None = Field(
        json_schema_extra=IMMUTABLE,
        default=None,
        max_length=MAX_STRING,
        description="Container image of the nodes. Default: the trainer image configured in the"
        " operator.",
    )
    image_pull_policy: ImagePullPolicy | None = Field(
        json_schema_extra=IMMUTABLE,
        default=None,
        description="When to pull the image: Always, IfNotPresent or Never. Default: the"
        " Kubernetes default for the image's tag.",
    )
    trainer: TrainerSettings | None = Field(
        json_schema_extra=IMMUTABLE,
        default=None,
        description="Settings of the bundled trainer, which runs when command is unset."
        " Mutually exclusive with command.",
    )
    command: list[Arg] | None = Field(
        json_schema_extra=IMMUTABLE,
        default=None,
        max_length=MAX_ARGS,
        description="Program each node runs instead of the bundled trainer, e.g."
        " [torchrun, /scripts/train.py]; torchrun's flags come from the PET_* environment the"
        " operator sets. Mutually exclusive with trainer.",
    )
    args: list[Arg] | None = Field(
        json_schema_extra=IMMUTABLE,
        default=None,
        max_length=MAX_ARGS,
        description="Arguments appended to command, or to the bundled trainer when command is"
        " unset.",
    )
    resources: ResourceRequirements | None = Field(
        json_schema_extra=IMMUTABLE,
        default=None,
        description="Compute resources of each node's training container (core/v1"
        " ResourceRequirements: limits, requests, claims).",
    )
    checkpoint: CheckpointSpec | None = Field(
        json_schema_extra=IMMUTABLE,
        default=None,
        description="Where and how often training state is saved. Without it nothing is"
        " saved, and a restarted node starts training from the beginning.",
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
        " One disruption costs one restart: a pod that was running before the last counted"
        " failure and fails within 60s of it (a survivor of a lost node), or is deleted within"
        " 5s of it (several pods of one drain), is recreated without being counted again; a"
        " recreated pod that fails is always counted. Losing the rendezvous store pod costs no"
        " restart. At least 0; default: 3.",
    )
    worker_restarts: int = Field(
        json_schema_extra=IMMUTABLE,
        default=3,
        ge=0,
        description="Times torchrun restarts the workers inside one pod before the pod fails"
        " (torchrun --max-restarts); with the bundled trainer, also the times a pod starts"
        " torchrun again after losing the rendezvous store pod. At least 0; default: 3."
        "",
    )
    fault_tolerance: FaultTolerance | None = Field(
        json_schema_extra=IMMUTABLE,
        default=None,
        description="How the job rides through a lost, deleted or failed node pod: mode"
        " Restart (the default: every worker restarts from the newest checkpoint) or PerStep"
        " (each node pod is a torchft replica group; the others keep training), and"
        " PerStep's knobs.",
    )
    active_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        description="Seconds after the job starts before it is stopped and Failed, whatever"
        " its progress. At least 1; default: no deadline.",
    )
    progress_deadline_seconds: int | None = Field(
        default=None,
        ge=0,
        description="Seconds a Running job, all of its pods ready, may go without a training"
        " step (status.progress.step unchanged, counted from rank 0's last report of a new step"
        " or its first report since the job became Running: until then it is starting) before"
        " it is restarted with reason Stalled: a deadlocked"
        " collective, a stuck data loader, a hang no timeout catches. Before that, each"
        " bundled-trainer worker writes every thread's Python stack to its log. A stall is a"
        " disruption; a second one at the same step counts against backoffLimit. Not counted"
        " while held (spec.trainer.holdAtSteps) or after the last step. 0 turns it off;"
        " default: the larger of 600 and"
        " 10 times the step time of the last two reports.",
    )
    startup_deadline_seconds: int = Field(
        default=300,
        ge=1,
        description="Seconds a pod may show a problem that retrying does not fix (an image"
        " that cannot be pulled, a missing PersistentVolumeClaim, a container config error),"
        " counted from the pod's creation, before the job is Failed with that reason. A pod"
        " no machine can take yet (Unschedulable) only waits, and says so. At least 1;"
        " default: 300.",
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
    spread: Spread = Field(
        json_schema_extra=IMMUTABLE,
        default=Spread.PREFERRED,
        description="How the node pods spread across machines. Required: a pod goes only to a"
        " machine with the fewest of the job's node pods (a topology spread constraint on"
        " kubernetes.io/hostname, maxSkew 1, whenUnsatisfiable DoNotSchedule): with no more"
        " pods than machines each has a machine of its own, with more they stay even, and a"
        " pod waits Pending while no such machine has room. Preferred: the scheduler favours"
        " such a machine but places the pod anyway, e.g. on a single-machine cluster or when"
        " the empty machines are full (whenUnsatisfiable ScheduleAnyway); in PerStep mode a"
        " group placed beside another while a machine was lost or not yet there is moved to"
        " that machine once it is back, one group at a time (a Rebalance incident). None: no"
        " constraint. Machines the pods may not run on (taints they do not tolerate, such as"
        " a control plane's or a lost machine's; nodeSelector and affinity) are not counted."
        " A kubernetes.io/hostname constraint in template.topologySpreadConstraints replaces"
        " this one. The rendezvous store pod is not spread. Default: Preferred.",
    )
    template: PodTemplateOverrides | None = Field(
        json_schema_extra=IMMUTABLE,
        default=None,
        description="Pod settings added to every node's pod: labels, scheduling, env,"
        " volumes, pull secrets, service account.",
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        """SPEC_RULES that need no previous version (the API server checks them all)."""
        values = self.model_dump(by_alias=True)
        for rule in SPEC_RULES:
            problem = rule.violated_by(values)
            if problem is not None:
                raise ValueError(problem)
        return self

    @property
    def elastic(self) -> bool:
        return self.max_nodes is not None

    @property
    def per_step(self) -> bool:
        """Whether the job runs in PerStep fault tolerance mode."""
        return self.fault_tolerance is not None and self.fault_tolerance.per_step

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
    loss: float | None = Field(
        default=None,
        json_schema_extra={"nullable": True},
        description="Latest training loss; null when it was not a finite number (NaN or"
        " infinite), which JSON cannot carry.",
    )
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
    groups: int | None = Field(
        default=None,
        description="Replica groups that trained the last step (PerStep mode).",
    )
    held_at_step: int | None = Field(
        default=None,
        description="Set while training is paused after this step by spec.trainer.holdAtSteps,"
        " until the file release-step-NNNNNNNN appears in the checkpoint folder.",
    )
    estimated_remaining_seconds: int | None = Field(
        default=None,
        description="Seconds until totalSteps at the pace between rank 0's last two reports"
        " (steps per second), as of updatedAt. Computed by the operator, not reported; unset"
        " before the second report, while held, when the step did not advance (a resume"
        " from a checkpoint), and while the job is Suspended, Failed or Queued.",
    )
    eta: str | None = Field(
        default=None,
        description="estimatedRemainingSeconds as a person reads it (42s, 5m07s, 3h05m,"
        " 2d04h): the ETA column of kubectl get -o wide. Computed by the operator, unset with it.",
    )


class Incident(_Model):
    """Something that stopped training, and what it cost (status.incidents)."""

    kind: str = Field(
        description="Failure, Disruption, NodeLost, Stalled, StoreLost, LighthouseLost,"
        " Resize or Rebalance: what the operator counted or did (the Event of the same time"
        " says more)."
    )
    detected_at: str = Field(
        json_schema_extra={"format": "date-time"},
        description="When the operator counted it (RFC 3339).",
    )
    at_step: int | None = Field(
        default=None, description="The step the job had reported when it was detected."
    )
    resumed_at: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When rank 0 next reported a step: training went on (unset while open).",
    )
    resumed_step: int | None = Field(default=None, description="The step of that report.")
    seconds: float | None = Field(
        default=None, description="From detectedAt to resumedAt: the training time it stopped."
    )
    steps_redone: int | None = Field(
        default=None,
        description="Steps trained again after it (from the checkpoint resumed up to atStep).",
    )
    lost_seconds: float | None = Field(
        default=None,
        description="The training time it cost, as goodput counts it: the time between rank 0's"
        " reports around it, less the steps trained across it at the pace before it, plus the"
        " redone steps' time. In PerStep mode the other groups' stall and slower pace; in"
        " Restart mode the restart. Incidents that close together (one outage) show the same.",
    )


class DDPJobStatus(_Model):
    """What the operator observed; written only by the operator."""

    phase: DDPJobPhase | None = Field(
        default=None,
        description="Pending, Running, Scaling, Restarting, Succeeded, Failed, Suspended, or"
        " Queued (waiting for Kueue to admit the job).",
    )
    reason: str | None = Field(
        default=None,
        description="The reason of the current phase's condition, e.g. ImagePullFailed,"
        " Unschedulable or BackoffLimitExceeded (docs/api.md lists them, with what to do).",
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
    image: str | None = Field(
        default=None,
        description="The image the job's node pods ran (spec.image, or the operator's default"
        " image when that is empty), as last seen on a node pod past Pending; kept when none"
        " is left, so that `kubectl ddp logs` and `plot` read the checkpoint volume with it."
        " Where spec.image is empty the operator gives the pods it makes later this image, not"
        " its default of the moment: an operator upgraded to a new trainer image never mixes"
        " two in one job.",
    )
    restarts: int | None = Field(
        default=None,
        description="Failures counted against spec.backoffLimit so far: node pods that exited"
        " non-zero or (Restart mode) were deleted while running, without a DisruptionTarget"
        " condition (one lost node and the peers that fail with it count once; in PerStep"
        " mode each failed pod counts).",
    )
    disruptions: int | None = Field(
        default=None,
        description="Node pods lost to a disruption so far: pods with the condition"
        " DisruptionTarget (eviction API and kubectl drain, preemption, taint eviction), and"
        " pods on a machine not Ready for longer than the operator's DDP_NODE_LOST_GRACE_S;"
        " in PerStep mode also node pods deleted by anyone while they run. Recreated at once;"
        " they never count against spec.backoffLimit.",
    )
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
    last_disruption_time: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When the operator last counted a disruption (RFC 3339); failures of older"
        " pods soon after it are its consequences, not failures of their own.",
    )
    incidents: list[Incident] | None = Field(
        default=None,
        description="The newest 10 incidents (failures, disruptions, lost machines, stalls,"
        " resizes) with when each was detected, when training went on, and the steps redone.",
    )
    kept_seconds: float | None = Field(
        default=None,
        description="Time spent in training steps that were kept (not redone after an incident).",
    )
    held_seconds: float | None = Field(
        default=None,
        description="Time rank 0 reported the job paused at a hold point"
        " (spec.trainer.holdAtSteps, heldAtStep set): neither kept nor lost, and left out of"
        " goodput.",
    )
    first_report_time: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When rank 0 made the job's first report (its updatedAt, RFC 3339): training"
        " began. The time from startTime to it is the start-up (pods scheduled and started,"
        " rendezvous, data loaded, the first steps); goodput counts from it.",
    )
    goodput: float | None = Field(
        default=None,
        description="keptSeconds over the wall time since firstReportTime less heldSeconds, as"
        " of the last report: the share of the job's training time in steps that were kept"
        " (0 to 1); the time that incidents cost (a restart's start-up included) is the rest.",
    )
    last_step_time: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When the operator last saw status.progress.step change (RFC 3339): the"
        " progress deadline counts from it.",
    )
    stalled_at_step: int | None = Field(
        default=None,
        description="The step of the last restart for a stall: a second stall there counts"
        " against backoffLimit.",
    )
    queue: str | None = Field(
        default=None,
        description="The Kueue LocalQueue the job waits in or was admitted from (its"
        " kueue.x-k8s.io/queue-name label).",
    )
    cluster_queue: str | None = Field(
        default=None,
        description="The Kueue ClusterQueue that admitted the job; unset while queued.",
    )
    admissions: int | None = Field(
        default=None, description="Times Kueue admitted the job (more than 1 after evictions)."
    )
    admitted_nodes: int | None = Field(
        default=None,
        description="The node pods Kueue admitted the job with (its Workload's admitted count;"
        " Kueue may admit fewer than spec.nodes, down to spec.minNodes): the job runs the"
        " smaller of spec.nodes and this. Unset while queued and without Kueue.",
    )
    handled_failures: list[Annotated[str, Field(max_length=64)]] | None = Field(
        default=None,
        max_length=MAX_HANDLED,
        description="uids of the pods already counted as failures or deleted by the operator"
        " that are still there, and of the newest that are gone, so that none is counted"
        " twice (bookkeeping of the operator).",
    )
    seen_running: dict[str, Annotated[str, Field(max_length=64)]] | None = Field(
        default=None,
        max_length=MAX_HANDLED,
        description="The node pods the operator last saw running and ready, name: uid. One"
        " that is gone, or ended while being deleted, when it looks again, that it neither"
        " deleted nor saw end (it went while no operator replica was leading, or too fast to"
        " be seen), is counted as a disruption (bookkeeping of the operator).",
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

    api_version: ApiVersion = Field(default=API_VERSION, description=API_VERSION)
    kind: Kind = Field(default=KIND, description=KIND)
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


SPEC_IMMUTABLE_FIELDS = tuple(
    f.alias or name
    for name, f in DDPJobSpec.model_fields.items()
    if isinstance(f.json_schema_extra, dict) and f.json_schema_extra.get(IMMUTABLE_KEY)
)
