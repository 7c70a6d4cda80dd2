"""The trainer's narrow permission: rank 0 reports its own job's progress, as the namespace's
trainer account (into its own pod) or as the job's own (into the job's ConfigMap)."""

from __future__ import annotations

from typing import Any

from ddp_api import contract
from ddp_api.ddpjob import DDPJob

from .common import DEFAULT_TRAINER_POLICY, PROGRESS_ACCOUNT, job_key, owned_meta, trainer_account


def reports_progress(job: DDPJob) -> bool:
    """Whether the job's pods run the bundled trainer, whose rank 0 reports progress."""
    return job.spec.command is None


def uses_trainer_account(job: DDPJob) -> bool:
    """Whether the job's pods run as a trainer account of ours, the namespace's or the job's own
    (rank 0 reports progress, and ``spec.template`` names no account of the user's)."""
    t = job.spec.template
    return reports_progress(job) and not (t is not None and t.service_account_name)


def render_namespace_trainer(
    namespace: str, cluster_role: str = DEFAULT_TRAINER_POLICY
) -> list[dict[str, Any]]:
    """The namespace's trainer account and the RoleBinding that gives it the chart's
    ``cluster_role`` (``patch`` on pods) in this namespace; the chart's admission policy narrows
    that to the progress annotation of the account's own pod. Owned by no job: made once, at the
    namespace's first bundled-trainer job, and kept."""
    rbac = "rbac.authorization.k8s.io"
    meta = {
        "name": PROGRESS_ACCOUNT,
        "namespace": namespace,
        "labels": {"app.kubernetes.io/managed-by": "ddp-operator"},
    }
    subject = {"kind": "ServiceAccount", "name": PROGRESS_ACCOUNT, "namespace": namespace}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": dict(meta)},
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "RoleBinding",
            "metadata": dict(meta),
            "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": cluster_role},
            "subjects": [subject],
        },
    ]


def render_progress_configmap(job: DDPJob) -> dict[str, Any]:
    """The ConfigMap that rank 0 writes its progress record to (empty until it does), where
    the admission policy is not seen (``OperatorConfig.progress_in_pod`` false)."""
    _, name, _ = job_key(job)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": owned_meta(job, contract.progress_configmap(name)),
    }


def render_trainer_identity(job: DDPJob) -> list[dict[str, Any]]:
    """The job's trainer ServiceAccount, and the Role and RoleBinding that let it patch the
    job's progress ConfigMap and nothing else (``resourceNames``: not even another job's): the
    identity of its pods where the admission policy is not seen."""
    _, name, _ = job_key(job)
    account = trainer_account(name)
    rbac = "rbac.authorization.k8s.io"
    rule = {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "resourceNames": [contract.progress_configmap(name)],
        "verbs": ["patch"],
    }
    subject = {"kind": "ServiceAccount", "name": account, "namespace": job_key(job)[0]}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": owned_meta(job, account)},
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "Role",
            "metadata": owned_meta(job, account),
            "rules": [rule],
        },
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "RoleBinding",
            "metadata": owned_meta(job, account),
            "roleRef": {"apiGroup": rbac, "kind": "Role", "name": account},
            "subjects": [subject],
        },
    ]
