"""What a job's pods are called and carry, where the operator that renders them and the client
that reads them must agree: their names, labels and selector, the trainer container's name, its
log line prefix, the restricted Pod Security settings, the trainer image used when a spec
names none and the one a pod runs, a pod's phases and the kubelet's reasons for an image it
cannot pull (core/v1's words). The rest of a pod is the operator's alone
(``ddp_operator.render``).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from .contract import LABEL_PREFIX

LABEL_JOB = f"{LABEL_PREFIX}job-name"
LABEL_ROLE = f"{LABEL_PREFIX}role"
LABEL_INDEX = f"{LABEL_PREFIX}node-index"
ROLE_WORKER = "worker"
CONTAINER = "trainer"


class PodPhase(StrEnum):
    """A pod's phase (core/v1 PodPhase)."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


# A container's waiting reasons when its image cannot be pulled or named (the kubelet's).
IMAGE_PULL_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName"}
)

# The trainer image of a job whose spec.image is empty, unless the operator's settings name one.
DEFAULT_IMAGE = "ghcr.io/ddp-operator/trainer:0.1.0"


def trainer_image(pod: Mapping[str, Any]) -> str:
    """The image of a pod's trainer container ("" for a pod without one: the store, the
    lighthouse)."""
    for c in (pod.get("spec") or {}).get("containers") or []:
        if c.get("name") == CONTAINER:
            return str(c.get("image") or "")
    return ""


# torchrun's prefix of each worker line (its --log-line-prefix-template): the global rank.
LOG_LINE_PREFIX_TEMPLATE = "[rank${rank}]: "

# The restricted Pod Security Standard, for every pod of a job (and the client's reader pod).
RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
}
RESTRICTED_POD = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "runAsGroup": 1000,
    "fsGroup": 1000,  # the checkpoint volume is writable by the trainer's user
    "seccompProfile": {"type": "RuntimeDefault"},
}


def worker_name(job: str, index: int) -> str:
    """The name of node ``index``'s pod (every attempt of it: a recreated pod keeps it)."""
    return f"{job}-node-{index}"


def worker_index(job: str, pod: str) -> int | None:
    """The node index of ``job``'s pod named ``pod``; None for a name of no node of ``job``."""
    prefix = worker_name(job, 0)[:-1]
    rest = pod[len(prefix) :] if pod.startswith(prefix) else ""
    return int(rest) if rest.isdigit() and rest == str(int(rest)) else None


def selector(job: str) -> str:
    """The label selector of a job's worker pods (``status.selector`` for ``kubectl scale``)."""
    return f"{LABEL_JOB}={job},{LABEL_ROLE}={ROLE_WORKER}"
