"""A worker pod's environment: torchrun's ``PET_*`` flags, the contract's variables, the
bundled trainer's configuration, PerStep's and the defaults the user's own may replace."""

from __future__ import annotations

import json
import math
from typing import Any

from ddp_api import contract
from ddp_api.ddpjob import DDPJob
from ddp_api.pods import LOG_LINE_PREFIX_TEMPLATE

from .common import RDZV_CONF, RESOLVER_OPTIONS, OperatorConfig, job_key, rdzv_endpoint

# What a node pod keeps of its grace period for its wrapper's last lines once torchrun has stopped
# its workers (``ddp_trainer.node``: torchrun's exit code, the kept log's drain).
WRAPPER_LAST_S = 2


def termination_grace_s(job: DDPJob, cfg: OperatorConfig) -> int:
    """A node pod's grace period: ``spec.template``'s, else the operator's; in PerStep mode one
    quorum try more (:func:`ddp_api.contract.quorum_timeout_s`): a group that waits for a
    quorum notices SIGTERM only when that try ends, and it may be the group that saves the
    last step."""
    t, ft = job.spec.template, job.spec.fault_tolerance
    grace = (t and t.termination_grace_period_seconds) or cfg.termination_grace_s
    if ft is None or not ft.per_step:
        return grace
    return grace + math.ceil(contract.quorum_timeout_s(ft.group_timeout_s))


def workers_stop_s(grace_s: int) -> int:
    """``PET_SHUTDOWN_TIMEOUT``: how long torchrun waits for its workers after passing them the
    pod's SIGTERM, before its SIGKILL: the pod's grace period but for the wrapper's last lines
    (:data:`WRAPPER_LAST_S`). torchrun's own is 30 s whatever the grace period: a SIGTERM
    checkpoint that takes longer (a large model, a slow volume) would be killed before it is
    complete, losing the steps since the last one."""
    return max(1, grace_s - WRAPPER_LAST_S)


def trainer_config_json(job: DDPJob) -> str:
    """What the bundled trainer reads from ``DDP_TRAINER_CONFIG``."""
    s = job.spec
    cfg: dict[str, Any] = (
        s.trainer.model_dump(by_alias=True, exclude_none=True, mode="json") if s.trainer else {}
    )
    if s.checkpoint is not None:
        cfg["checkpointEverySteps"] = s.checkpoint.every_steps
        cfg["checkpointKeep"] = s.checkpoint.keep
    return json.dumps(cfg, sort_keys=True, separators=(",", ":"))


def metrics_port(job: DDPJob) -> int | None:
    """The port of the bundled trainer's Prometheus endpoint; None when it has none (the port
    is 0, or the pod runs the user's own command)."""
    s = job.spec
    if s.command is not None:
        return None
    port = s.trainer.metrics_port if s.trainer else contract.DEFAULT_METRICS_PORT
    return port or None


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _or_empty(value: int | None) -> str:
    return "" if value is None else str(value)


def worker_env(job: DDPJob, index: int, cfg: OperatorConfig) -> list[dict[str, Any]]:
    s = job.spec
    ns, name, uid = job_key(job)
    lo, hi = s.node_range()
    if s.per_step:  # a replica group of its own: a rendezvous inside the pod
        rdzv: list[dict[str, Any]] = [
            {"name": "PET_NNODES", "value": "1"},
            {"name": "PET_NPROC_PER_NODE", "value": str(s.nproc_per_node)},
            {"name": "PET_STANDALONE", "value": "1"},
            # standalone torchrun draws its own run id; the node wrapper names the run's
            # completion record by this one (the job's uid, as in Restart mode)
            {"name": "PET_RDZV_ID", "value": uid},
        ]
    else:
        rdzv = [
            {"name": "PET_NNODES", "value": f"{lo}:{hi}"},
            {"name": "PET_NPROC_PER_NODE", "value": str(s.nproc_per_node)},
            {"name": "PET_RDZV_BACKEND", "value": "c10d"},
            {"name": "PET_RDZV_ENDPOINT", "value": rdzv_endpoint(name, ns)},
            {"name": "PET_RDZV_ID", "value": uid},
            {"name": "PET_RDZV_CONF", "value": RDZV_CONF},
        ]
    env: list[dict[str, Any]] = [
        *rdzv,
        _field_env("PET_LOCAL_ADDR", "status.podIP"),
        {"name": "PET_MAX_RESTARTS", "value": str(s.worker_restarts)},
        {"name": "PET_MONITOR_INTERVAL", "value": str(cfg.monitor_interval_s)},
        # torchrun's shared rendezvous TCPStore breaks re-rendezvous on scale-up (a joiner
        # waits for a MASTER_ADDR published only in round one): see trainer_image/README.md.
        {"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"},
        {"name": contract.ENV_JOB_NAME, "value": name},
        {"name": contract.ENV_JOB_NAMESPACE, "value": ns},
        {"name": contract.ENV_NODE_INDEX, "value": str(index)},
        {"name": contract.ENV_PROGRESS_DEADLINE, "value": _or_empty(s.progress_deadline_seconds)},
        _field_env(contract.ENV_POD_NAME, "metadata.name"),
        _field_env(contract.ENV_POD_IP, "status.podIP"),
    ]
    if s.checkpoint is not None:
        env.append({"name": contract.ENV_CHECKPOINT_DIR, "value": s.checkpoint.path})
    env += fault_tolerance_env(job, index)
    if s.command is None:
        env.append({"name": contract.ENV_TRAINER_CONFIG, "value": trainer_config_json(job)})
        into = (
            contract.PROGRESS_INTO_POD if cfg.progress_in_pod else contract.PROGRESS_INTO_CONFIGMAP
        )
        env.append({"name": contract.ENV_PROGRESS_INTO, "value": into})
    user_env = [dict(e) for e in (s.template.env if s.template and s.template.env else [])]
    defaults = {
        "LOGLEVEL": "INFO",  # torchrun's agent logs each rendezvous and restart
        # Every worker line names its global rank, so that merged logs say who wrote what.
        "PET_TEE": "3",
        "PET_LOG_LINE_PREFIX_TEMPLATE": LOG_LINE_PREFIX_TEMPLATE,
        # torchrun writes the relayed lines to a pipe without flushing: without this, they
        # reach the pod's log in blocks of 8 KiB, or when the pod ends.
        "PYTHONUNBUFFERED": "1",
        "PET_SHUTDOWN_TIMEOUT": str(workers_stop_s(termination_grace_s(job, cfg))),
        "RES_OPTIONS": RESOLVER_OPTIONS,
    }
    threads = cpu_threads_per_process(
        s.resources.model_dump(exclude_none=True) if s.resources else {}, s.nproc_per_node
    )
    if threads is not None:
        defaults["OMP_NUM_THREADS"] = str(threads)
    user_names = {e.get("name") for e in user_env}
    env += [{"name": k, "value": v} for k, v in defaults.items() if k not in user_names]
    # The user's variables come last so that they can override ours deliberately.
    return env + user_env


def fault_tolerance_env(job: DDPJob, index: int) -> list[dict[str, Any]]:
    """What a PerStep node pod needs to join its job's quorum (nothing in Restart mode, whose
    pods read ``DDPJOB_FAULT_TOLERANCE`` unset as Restart)."""
    s = job.spec
    ft = s.fault_tolerance
    if ft is None or not ft.per_step:
        return []
    ns, name, _ = job_key(job)
    return [
        {"name": contract.ENV_FAULT_TOLERANCE, "value": contract.FAULT_TOLERANCE_PER_STEP},
        {"name": contract.ENV_LIGHTHOUSE, "value": contract.lighthouse_address(name, ns)},
        {"name": contract.ENV_REPLICA_GROUP, "value": str(index)},
        {"name": contract.ENV_GROUPS, "value": str(s.nodes)},
        {"name": contract.ENV_MIN_GROUPS, "value": str(ft.groups_min)},
        {"name": contract.ENV_GROUP_TIMEOUT, "value": str(ft.group_timeout_s)},
    ]


def cpu_quantity(q: int | float | str) -> float:
    """CPUs in a Kubernetes quantity: 2 -> 2.0, "500m" -> 0.5, "1.5" -> 1.5."""
    text = str(q).strip()
    if text.endswith("m"):
        return float(text[:-1]) / 1000
    return float(text)


def cpu_threads_per_process(resources: dict[str, Any], nproc: int | str) -> int | None:
    """OMP_NUM_THREADS for each worker: the container's CPUs (limit, else request) shared by
    its ``nproc`` processes, at least 1. None when no CPU quantity is given or ``nproc`` is
    ``auto`` without a GPU limit to count processes by.

    Why: torch sizes its thread pool by the host's cores, not the container's quota, so two
    pods on one node (or one pod under a CPU limit) each spin a host-sized pool and slow each
    other down several times; torchrun only sets 1 when it starts several processes itself.
    """
    cpu = (resources.get("limits") or {}).get("cpu") or (resources.get("requests") or {}).get("cpu")
    if cpu is None:
        return None
    procs: int | float | str | None = nproc
    if not isinstance(nproc, int):  # "auto": one process per GPU, if the GPUs are counted
        procs = (resources.get("limits") or {}).get("nvidia.com/gpu")
    if procs is None:
        return None
    try:
        return max(1, int(cpu_quantity(cpu) // max(1, int(cpu_quantity(procs)))))
    except ValueError:  # a quantity such as "2k": leave the pool to torch
        return None
