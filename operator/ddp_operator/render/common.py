"""What every part of a job's rendering shares: the operator's settings, the names of a job's
objects and their metadata (labels, owner), and ``spec.template``'s pod spec fields."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ddp_api import contract
from ddp_api.ddpjob import DDPJob
from ddp_api.metav1 import owner_reference
from ddp_api.pods import DEFAULT_IMAGE, LABEL_JOB, LABEL_ROLE

ANNOTATION_ATTEMPT = f"{contract.LABEL_PREFIX}attempt"
ROLE_STORE = "rdzv-store"
STORE_CONTAINER = "store"
# A PerStep job's lighthouse pod (``contract.lighthouse_name``), in place of the store pod.
ROLE_LIGHTHOUSE = "lighthouse"
LIGHTHOUSE_CONTAINER = "lighthouse"
LIGHTHOUSE_PORT_NAME = "lighthouse"
# How long the lighthouse waits for groups that heartbeat but have not asked for this step's
# quorum before it issues one without them (torchft's default is 60 s: survivors would wait
# that long for a group still starting); how often it checks.
LIGHTHOUSE_JOIN_TIMEOUT_MS = 1000
LIGHTHOUSE_QUORUM_TICK_MS = 100
# The namespace-wide account of release 0.1.0, whose Role could patch the status of every DDPJob
# of its namespace: its pods keep it until they end (see trainer_objects.LegacyAccount.retire).
LEGACY_TRAINER_ACCOUNT = "ddp-trainer"
# The trainer pods' account in each namespace, made at the namespace's first bundled-trainer job
# and bound to the chart's ClusterRole ``<release>-trainer-progress`` (``patch`` on pods); the
# chart's ValidatingAdmissionPolicy and its binding of that name let it change nothing but the
# progress annotation of the pod its token is bound to.
PROGRESS_ACCOUNT = "ddp-trainer-progress"
# That ClusterRole's, policy's and binding's name in manifests/ (release ddp-operator); the
# chart tells the operator its own (DDP_TRAINER_POLICY).
DEFAULT_TRAINER_POLICY = "ddp-operator-trainer-progress"
SHM_SIZE = "2Gi"
HOSTNAME_KEY = "kubernetes.io/hostname"  # the well-known label naming a node's machine

# The resolver's options (glibc's ``RES_OPTIONS``) for the job's own pods: a try waits 1 s, two
# tries (glibc's own: 5 s, two tries). torch's c10d looks up the name of every TCPStore peer's
# address (``getnameinfo``), on the client and on the store's one server thread, and stops
# looking only after one fails. A lost machine that ran one of the cluster's DNS servers stays
# in the DNS Service until it is marked NotReady (about 30 s on kind), and a lookup sent there
# fails after both tries; a store's server thread looked a connecting client up twice first:
# 20 s in which the store answered no one, where a PerStep group's connect to its quorum's store
# waits 5 s (the group timeout). With these options, 4 s (tests/trainer/test_trainer_dead_dns.py).
RESOLVER_OPTIONS = "timeout:1 attempts:2"

RDZV_CONF = (
    "is_host=false,join_timeout=900,last_call_timeout=15,close_timeout=60,read_timeout=60,"
    "keep_alive_interval=2,keep_alive_max_attempt=3"
)


@dataclass(frozen=True)
class OperatorConfig:
    """Settings of the operator itself (from its environment), used when a spec is silent."""

    default_image: str = DEFAULT_IMAGE
    monitor_interval_s: float = 1.0  # how soon a lost store or worker is noticed
    termination_grace_s: int = 60
    # Trainer pods run as the namespace's PROGRESS_ACCOUNT and report into their own pod: the
    # controller sets it false while it does not see the admission policy that confines that
    # account (then: the job's own account and ConfigMap, as before).
    progress_in_pod: bool = True


def user_env_value(job: DDPJob, name: str, default: str) -> str:
    """The value ``spec.template.env`` gives ``name`` (not a valueFrom), else ``default``."""
    for e in (job.spec.template.env if job.spec.template else None) or []:
        if e.get("name") == name and isinstance(e.get("value"), str):
            return str(e["value"])
    return default


def store_name(job: str) -> str:
    return f"{job}-rdzv"


def trainer_account(job: str) -> str:
    """The ServiceAccount (and its Role and RoleBinding) of a job's trainer pods."""
    return f"{job}-trainer"


def rdzv_endpoint(job: str, namespace: str) -> str:
    return f"{store_name(job)}.{namespace}.svc:{contract.RDZV_PORT}"


def job_key(job: DDPJob) -> tuple[str, str, str]:
    """(namespace, name, uid) of a job read from the API server."""
    m = job.metadata
    return str(m.get("namespace", "default")), str(m["name"]), str(m.get("uid", ""))


def owned_meta(job: DDPJob, name: str) -> dict[str, Any]:
    """The metadata of an object that belongs to ``job`` and goes with it, pods aside."""
    ns, job_name, _ = job_key(job)
    return {
        "name": name,
        "namespace": ns,
        "labels": {LABEL_JOB: job_name},
        "ownerReferences": [owner_reference(job.metadata)],
    }


def role_meta(job: DDPJob, name: str, role: str, extra: dict[str, str] | None = None) -> dict:
    """The metadata of a job's pod or Service: ``spec.template``'s labels and annotations, the
    job's labels (``role``, ``extra``) and its owner reference."""
    ns, job_name, _ = job_key(job)
    tmpl = job.spec.template
    pod_meta = tmpl.metadata if tmpl and tmpl.metadata else None
    labels = dict(pod_meta.labels or {}) if pod_meta else {}
    annotations = dict(pod_meta.annotations or {}) if pod_meta else {}
    labels.update({LABEL_JOB: job_name, LABEL_ROLE: role, **(extra or {})})
    return {
        "name": name,
        "namespace": ns,
        "labels": labels,
        "annotations": annotations,
        "ownerReferences": [owner_reference(job.metadata)],
    }


def pod_spec_overrides(job: DDPJob) -> dict[str, Any]:
    """The scheduling and identity settings of ``spec.template`` as pod spec fields."""
    t = job.spec.template
    if t is None:
        return {}
    fields: dict[str, Any] = {
        "nodeSelector": t.node_selector,
        "tolerations": t.tolerations,
        "affinity": t.affinity,
        "imagePullSecrets": [r.model_dump() for r in t.image_pull_secrets or []],
        "priorityClassName": t.priority_class_name,
        "schedulerName": t.scheduler_name,
    }
    return {k: v for k, v in fields.items() if v}
