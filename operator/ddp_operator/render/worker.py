"""A node's pod: the trainer container, its volumes and ports, where it may run and who it is
to the API server."""

from __future__ import annotations

from typing import Any

from ddp_api import contract
from ddp_api.ddpjob import DDPJob, Spread
from ddp_api.pods import (
    CONTAINER,
    LABEL_INDEX,
    LABEL_JOB,
    LABEL_ROLE,
    RESTRICTED_CONTAINER,
    RESTRICTED_POD,
    ROLE_WORKER,
    worker_name,
)

from .common import (
    ANNOTATION_ATTEMPT,
    HOSTNAME_KEY,
    PROGRESS_ACCOUNT,
    SHM_SIZE,
    OperatorConfig,
    job_key,
    pod_spec_overrides,
    role_meta,
    trainer_account,
)
from .env import metrics_port, termination_grace_s, worker_env
from .identity import uses_trainer_account


def worker_ports(job: DDPJob) -> list[dict[str, Any]]:
    ports: list[dict[str, Any]] = [{"name": "c10d", "containerPort": contract.RDZV_PORT}]
    port = metrics_port(job)
    if port is not None:
        ports.append({"name": contract.METRICS_PORT_NAME, "containerPort": port})
    return ports


def spread_constraints(job: DDPJob) -> list[dict[str, Any]]:
    """The node pods' topologySpreadConstraints: the user's own (``spec.template``), then one on
    the machine (``spec.spread``, :func:`machine_constraint`) unless the user's include one on
    kubernetes.io/hostname."""
    t = job.spec.template
    own = [dict(c) for c in (t.topology_spread_constraints if t else None) or []]
    machine = machine_constraint(job)
    return [*own, machine] if machine is not None else own


def machine_constraint(job: DDPJob) -> dict[str, Any] | None:
    """The operator's constraint on the machine (``spec.spread``); None with ``spread: None``
    or where the user's own constraints include one on kubernetes.io/hostname.

    maxSkew 1 rather than a required pod anti-affinity: with no more pods than machines each
    pod gets a machine of its own, and with more they stay even instead of Pending forever.
    Honoring taints and node affinity keeps machines the pods may not run on (a control
    plane, a lost machine) from counting as empty machines that every pod must wait for."""
    t, spread = job.spec.template, job.spec.spread
    own = (t.topology_spread_constraints if t else None) or []
    if spread == Spread.NONE or any(c.get("topologyKey") == HOSTNAME_KEY for c in own):
        return None
    _, name, _ = job_key(job)
    unsatisfiable = "DoNotSchedule" if spread == Spread.REQUIRED else "ScheduleAnyway"
    return {
        "maxSkew": 1,
        "topologyKey": HOSTNAME_KEY,
        "whenUnsatisfiable": unsatisfiable,
        "labelSelector": {"matchLabels": {LABEL_JOB: name, LABEL_ROLE: ROLE_WORKER}},
        "nodeAffinityPolicy": "Honor",
        "nodeTaintsPolicy": "Honor",
    }


def _resources(resources: dict[str, Any]) -> dict[str, Any]:
    """core/v1 ResourceRequirements with every quantity as a string (2 -> "2")."""
    out: dict[str, Any] = dict(resources)
    for key in ("limits", "requests"):
        if key in out:
            out[key] = {name: str(q) for name, q in out[key].items()}
    return out


def render_worker(job: DDPJob, index: int, attempt: int, cfg: OperatorConfig) -> dict[str, Any]:
    """The pod of node ``index``; ``attempt`` counts its recreations after failures."""
    s, (_, name, _) = job.spec, job_key(job)
    t = s.template
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
    ]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if s.checkpoint is not None:
        volumes.append({"name": "checkpoints", **s.checkpoint.volume})
        mounts.append({"name": "checkpoints", "mountPath": s.checkpoint.path})
    if t is not None:
        volumes += [dict(v) for v in t.volumes or []]
        mounts += [dict(m) for m in t.volume_mounts or []]
    if s.command is not None:
        command, args = list(s.command), list(s.args or [])
    else:
        # torchrun under ddp_trainer.node, which starts it again if the store pod is replaced.
        command = ["python", "-m", "ddp_trainer.node"]
        args = ["--module", "ddp_trainer", *(s.args or [])]
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": s.image or cfg.default_image,
        "command": command,
        "args": args,
        "env": worker_env(job, index, cfg),
        "ports": worker_ports(job),
        "volumeMounts": mounts,
        "securityContext": dict(RESTRICTED_CONTAINER),
    }
    if s.image_pull_policy:
        container["imagePullPolicy"] = s.image_pull_policy
    if s.resources:
        container["resources"] = _resources(
            s.resources.model_dump(by_alias=True, exclude_none=True)
        )
    meta = role_meta(job, worker_name(name, index), ROLE_WORKER, {LABEL_INDEX: str(index)})
    meta["annotations"][ANNOTATION_ATTEMPT] = str(attempt)
    spread = spread_constraints(job)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "hostname": worker_name(name, index),
            "subdomain": name,
            "restartPolicy": "Never",  # torchrun restarts workers; the operator, pods
            **_identity(job, cfg),
            "terminationGracePeriodSeconds": termination_grace_s(job, cfg),
            "securityContext": dict(RESTRICTED_POD),
            "containers": [container],
            "volumes": volumes,
            **pod_spec_overrides(job),
            **({"topologySpreadConstraints": spread} if spread else {}),
        },
    }


def _identity(job: DDPJob, cfg: OperatorConfig) -> dict[str, Any]:
    """Who a worker pod is to the API server: the user's account when ``spec.template`` names
    one; a trainer account when rank 0 reports progress (the namespace's, or the job's own
    where the admission policy is not seen); else no credential."""
    t = job.spec.template
    if t is not None and t.service_account_name:
        return {"serviceAccountName": t.service_account_name}
    if uses_trainer_account(job):
        account = PROGRESS_ACCOUNT if cfg.progress_in_pod else trainer_account(job_key(job)[1])
        return {"serviceAccountName": account}
    return {"automountServiceAccountToken": False}
