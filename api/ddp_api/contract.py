"""The contract between the operator, its trainer pods and the user's client, written once and
imported by all three: the API's names and label prefix, the rendezvous port, the environment
the operator sets, the timestamp format of status fields, the run log rank 0 writes and the
nodes' kept logs.

Torch-free, like all of ``ddp_api``: the operator and the client import it without torch.
``tests/unit/test_contract.py`` fails when either side drifts from it.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

GROUP = "ddp.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "DDPJob"
PLURAL = "ddpjobs"
# The prefix of the labels and annotations the operator puts on a job's objects, and of the
# keys the trainer writes into the rendezvous store.
LABEL_PREFIX = f"{GROUP}/"

# The port of a job's rendezvous store pod (:mod:`ddp_api.rdzv_store`): its Service,
# the store's --port and every node's ``PET_RDZV_ENDPOINT`` (``<job>-rdzv.<namespace>.svc:PORT``).
RDZV_PORT = 29400

# The environment of a trainer pod that the operator sets (besides torchrun's PET_* flags).
ENV_JOB_NAME = "DDPJOB_NAME"  # the job whose progress rank 0 reports ...
ENV_JOB_NAMESPACE = "DDPJOB_NAMESPACE"  # ... and its namespace
ENV_NODE_INDEX = "DDPJOB_NODE_INDEX"
ENV_POD_IP = "POD_IP"  # the pod's IP (fieldRef status.podIP): IPv6 in an IPv6-only cluster
ENV_CHECKPOINT_DIR = "DDPJOB_CHECKPOINT_DIR"
ENV_TRAINER_CONFIG = "DDP_TRAINER_CONFIG"  # spec.trainer as a JSON object
ENV_PROGRESS_INTERVAL = "DDPJOB_PROGRESS_INTERVAL_S"  # optional: seconds between reports
# spec.progressDeadlineSeconds ("" when unset: the default rule); workers write their stacks first
ENV_PROGRESS_DEADLINE = "DDPJOB_PROGRESS_DEADLINE_S"

# The trainer's Prometheus endpoint (`spec.trainer.metricsPort`): the name of the container port
# the operator declares for it (what a PodMonitor selects), and the port when unset.
METRICS_PORT_NAME = "metrics"
DEFAULT_METRICS_PORT = 9400

# Rank 0 reports progress, never into the DDPJob: the operator validates the record and copies
# it into ``status.progress`` (the only writer of a status). Where it writes is
# ``ENV_PROGRESS_INTO``: ``pod``, the annotation ``PROGRESS_ANNOTATION`` of its own pod (the pod
# whose name is ``ENV_POD_NAME``), the one change an admission policy lets the namespace's
# trainer account make; or ``configmap`` (also when unset: pods of earlier releases), the data
# key ``PROGRESS_KEY`` of the job's ConfigMap ``<job>-progress``, the one object the job's own
# account may patch (docs/design.md, Security).
ENV_PROGRESS_INTO = "DDPJOB_PROGRESS_INTO"
PROGRESS_INTO_POD, PROGRESS_INTO_CONFIGMAP = "pod", "configmap"
ENV_POD_NAME = "POD_NAME"  # the pod's own name (fieldRef metadata.name)
PROGRESS_ANNOTATION = f"{LABEL_PREFIX}progress"  # one JSON object, the fields of Progress
PROGRESS_KEY = "progress"  # the ConfigMap's data key: the same JSON object
PROGRESS_SUFFIX = "-progress"


def progress_configmap(job: str) -> str:
    """The name of the ConfigMap that rank 0 of ``job`` writes its progress to."""
    return f"{job}{PROGRESS_SUFFIX}"


def progress_configmap_path(namespace: str, job: str) -> str:
    """The API path of that ConfigMap."""
    return f"/api/v1/namespaces/{namespace}/configmaps/{progress_configmap(job)}"


def pod_path(namespace: str, pod: str) -> str:
    """The API path of a pod (rank 0's own, which it annotates with its progress)."""
    return f"/api/v1/namespaces/{namespace}/pods/{pod}"


# The run log: global rank 0 appends one JSON object per line to this file in the checkpoint
# folder (``ddp_trainer.reporting.run_log.RunLog``); ``kubectl ddp plot`` reads it back.
RUN_LOG_FILE = "metrics.jsonl"  # the name predates "run log"; checkpoint folders keep it


def parse_run_log(text: str) -> list[dict[str, Any]]:
    """The objects of metrics.jsonl's text; a torn or foreign line is skipped."""
    lines = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            lines.append(row)
    return lines


# Per-step fault tolerance (``spec.faultTolerance.mode: PerStep``): each node pod is one torchft
# replica group; the operator runs one lighthouse pod per job (``torchft_lighthouse``) behind the
# Service ``<job>-lighthouse`` on LIGHTHOUSE_PORT, and no rendezvous store. The node pods get:
ENV_FAULT_TOLERANCE = "DDPJOB_FAULT_TOLERANCE"  # "Restart" (also when unset) or "PerStep"
FAULT_TOLERANCE_RESTART, FAULT_TOLERANCE_PER_STEP = "Restart", "PerStep"
ENV_LIGHTHOUSE = "TORCHFT_LIGHTHOUSE"  # torchft's own name: http://<job>-lighthouse.<ns>.svc:PORT
ENV_REPLICA_GROUP = "REPLICA_GROUP_ID"  # this pod's group, = its node index (torchft's examples)
ENV_GROUPS = "NUM_REPLICA_GROUPS"  # spec.nodes when the pod was made (a hint; the quorum decides)
ENV_MIN_GROUPS = "DDPJOB_MIN_GROUPS"  # spec.faultTolerance.minGroups: the fewest that may step
# spec.faultTolerance.groupTimeoutSeconds: the lighthouse drops a group silent this long, and a
# collective that waits this long on a lost peer fails (the step is then redone, not the run)
ENV_GROUP_TIMEOUT = "DDPJOB_GROUP_TIMEOUT_S"
LIGHTHOUSE_PORT = 29510
LIGHTHOUSE_SUFFIX = "-lighthouse"


def lighthouse_name(job: str) -> str:
    """The name of a PerStep job's lighthouse pod and of its Service."""
    return f"{job}{LIGHTHOUSE_SUFFIX}"


def lighthouse_address(job: str, namespace: str) -> str:
    """``TORCHFT_LIGHTHOUSE`` of a PerStep job's node pods."""
    return f"http://{lighthouse_name(job)}.{namespace}.svc:{LIGHTHOUSE_PORT}"


def quorum_timeout_s(group_timeout_s: float) -> float:
    """How long one try at a quorum waits in a PerStep group (then it is tried again: a
    lighthouse that restarts, or too few groups, costs waiting, never the process): long enough
    for the lighthouse to drop a silent group (``group_timeout_s``) and issue the quorum. A
    group notices SIGTERM only when its try ends, so the operator gives PerStep node pods this
    long on top of their termination grace period: the writer group saves its last step even
    when its peers and the lighthouse went first (a suspended job)."""
    return max(10.0, 3 * group_timeout_s)


# The kept logs: each node pod's wrapper (``ddp_trainer.node``) copies its pod's log, each line
# after its RFC 3339 time as ``pods/log?timestamps=true`` gives it, into ``<pod>.log`` in this
# folder of the checkpoint folder, rotated to ``<pod>.log.1`` (the newest older part) up to
# ``<pod>.log.<files - 1>``; ``kubectl ddp logs`` reads them back once the pods are gone.
LOGS_DIR = "logs"
ENV_LOG_FILES = "DDPJOB_LOG_FILES"  # how many files of a pod's log are kept; 0: none
ENV_LOG_FILE_MIB = "DDPJOB_LOG_FILE_MIB"  # each file's size in MiB before it is rotated
_KEPT_LOG = re.compile(r"^(?P<pod>[a-z0-9]([-.a-z0-9]*[a-z0-9])?)\.log(?:\.(?P<part>[1-9]\d*))?$")


def kept_log_name(pod: str, part: int = 0) -> str:
    """The file of ``pod``'s kept log: ``<pod>.log`` (part 0, the one written to), or its
    ``part``-th older rotated file ``<pod>.log.<part>``."""
    return f"{pod}.log" if part == 0 else f"{pod}.log.{part}"


def parse_kept_log_name(name: str) -> tuple[str, int] | None:
    """(pod, part) of a kept log's file name; None for any other file."""
    found = _KEPT_LOG.match(name)
    if not found:
        return None
    return found.group("pod"), int(found.group("part") or 0)


# Why a worker failed, in its own words: Kubernetes' termination message (the file at the
# container's terminationMessagePath, which the kubelet copies into the container's terminated
# state when it ends). The bundled trainer writes one line, ``<Kind>: <what and the fix>``
# (``ddp_trainer.launch.exits``); so may a script of the user's. The operator adds it to the
# failure it reports (a pod's Event, the Failed condition), and fails the job at once when the
# kind is one that no retry can change (:data:`REFUSALS`).
TERMINATION_LOG = "/dev/termination-log"  # Kubernetes' default terminationMessagePath
ENV_TERMINATION_LOG = "DDPJOB_TERMINATION_LOG"  # another file (outside a pod: tests, local runs)
TERMINATION_MAX_CHARS = 1024  # the kubelet keeps 4096 bytes of a container's message
INCOMPATIBLE_RESUME = "IncompatibleResume"  # the checkpoint folder holds another run's state
REFUSALS = frozenset({INCOMPATIBLE_RESUME})
# A program that does not compile (the node wrapper reads its SyntaxError from the traceback:
# ddp_trainer.launch.last_words): no restart changes it, so the job fails at once.
SYNTAX_ERRORS = frozenset({"SyntaxError", "IndentationError", "TabError"})


def one_line(text: str, limit: int) -> str:
    """``text`` with its whitespace folded to single spaces, cut to ``limit`` characters (the
    last three ``...``) when longer: how a termination message is written and quoted."""
    words = " ".join(text.split())
    return words if len(words) <= limit else words[: limit - 3] + "..."


def termination_kind(message: str) -> tuple[str, str]:
    """(kind, the rest) of a termination message ``<Kind>: <text>``; ("", message) when its
    first word is no exception-like name."""
    head, sep, rest = message.partition(": ")
    if sep and head.isidentifier() and head[:1].isupper():
        return head, rest.strip()
    return "", message.strip()


# Status timestamps: RFC 3339 in UTC, whole seconds, as Kubernetes writes them.
TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def rfc3339(when: dt.datetime | float) -> str:
    """A status timestamp from an aware datetime or a Unix time."""
    if not isinstance(when, dt.datetime):
        when = dt.datetime.fromtimestamp(when, dt.UTC)
    return when.astimezone(dt.UTC).strftime(TIMESTAMP_FORMAT)


def parse_rfc3339(value: str | None) -> dt.datetime | None:
    """The aware datetime of a status timestamp; None when unset."""
    if not value:
        return None
    return dt.datetime.strptime(value, TIMESTAMP_FORMAT).replace(tzinfo=dt.UTC)


def duration_text(seconds: int) -> str:
    """``42s``, ``5m07s``, ``3h05m``, ``2d04h``: a span of time as a person reads it (the ETA
    column of ``kubectl get``, ``kubectl ddp watch``)."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"
