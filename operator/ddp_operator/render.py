"""Pure rendering: (DDPJob, index) -> the Services and Pods that run it. No I/O here.

This is the only module that knows the contract between the operator and a trainer pod. The
bundled trainer's pods run ``python -m ddp_trainer.node --module ddp_trainer``: torchrun, started
again in the same pod when the rendezvous store pod is replaced. torchrun reads ``PET_<FLAG>``
variables as its flags:

==============================  ================================================================
variable                        value
==============================  ================================================================
PET_NNODES                      ``minNodes:maxNodes`` (elastic bounds)
PET_NPROC_PER_NODE              ``nprocPerNode`` (an integer or ``auto``)
PET_RDZV_BACKEND                ``c10d``
PET_RDZV_ENDPOINT               ``<job>-rdzv.<namespace>.svc:29400`` (``contract.RDZV_PORT``):
                                the job's own store pod, so no trainer pod hosts the rendezvous
                                and any one may die
PET_RDZV_ID                     the DDPJob's uid (never ``none``: jobs must not share state);
                                rank 0's completion record in the checkpoint folder names it
PET_RDZV_CONF                   ``is_host=false`` plus join/last-call/close/read timeouts for
                                pods that start minutes apart, and a keep-alive every 2 s, 3
                                missed ones a dead node (torchrun: 5 s, 3): a machine that went
                                silent leaves the rendezvous in 6 s, before a round's 15 s last
                                call can admit it (its collectives: ``stepTimeoutS``, below)
PET_LOCAL_ADDR                  the pod IP (fieldRef): pod hostnames may not resolve for peers
PET_MAX_RESTARTS                ``workerRestarts``: worker restarts inside one pod, and restarts
                                of torchrun after losing the store (``ddp_trainer.node``)
PET_MONITOR_INTERVAL            how often the agent checks its workers and the rendezvous
DDPJOB_NAME/_NAMESPACE          whose progress rank 0 reports (see "Identity" below)
DDPJOB_PROGRESS_INTO            ``pod``: rank 0 writes its record into its own pod's annotation
                                ``ddp.dev/progress``; ``configmap``: into the ConfigMap
                                ``<job>-progress`` (bundled trainer only)
DDPJOB_NODE_INDEX               this pod's index (0-based)
POD_NAME, POD_IP                the pod's name and IP (fieldRef); the trainer's metrics endpoint
                                listens on IPv6 too when the IP is IPv6
DDPJOB_CHECKPOINT_DIR           the checkpoint volume's mount path
DDP_TRAINER_CONFIG              ``spec.trainer`` plus ``checkpointEverySteps``/``checkpointKeep``
                                as JSON, for the bundled trainer
LOGLEVEL                        ``INFO``: torchrun's agent logs rendezvous rounds and restarts
PET_TEE                         ``3``: the workers' stdout and stderr reach the pod's log
                                through torchrun (which keeps a copy under ``/tmp``), ...
PET_LOG_LINE_PREFIX_TEMPLATE    ... each line prefixed ``[rank<R>]: `` with its global rank,
                                which ``kubectl ddp logs`` reads (``ddp_client.loglines``)
PYTHONUNBUFFERED                ``1``: torchrun relays those lines without flushing; any image
                                (not only the trainer's, which sets it) shows them at once
OMP_NUM_THREADS                 the container's CPUs (limit, else request) per worker process,
                                at least 1; not set without a CPU quantity
==============================  ================================================================

A lost machine sends nothing (no FIN, no RST), and torchrun's agent re-rendezvouses only when a
worker fails or a new node waits: a peer's keep-alive going stale changes nothing for a round in
progress. Survivors notice a silent peer when their next collective times out: the bundled
trainer's ``stepTimeoutS`` (60 s) once every rank has taken its first step, ``pgTimeoutS``
(1800 s) before that and around the end; then their workers fail, torchrun starts them again
(one of ``workerRestarts``), and the rendezvous completes without the lost node after the last
call (elastic), or when its replacement pod joins. ``docs/benchmarks.md``: "A silent peer".

PerStep mode (``spec.faultTolerance.mode: PerStep``): each pod is a torchft replica group of its
own, torchrun's rendezvous is inside the pod (``PET_NNODES=1``, ``PET_STANDALONE=1``; of
``PET_RDZV_*`` only ``PET_RDZV_ID``, the job's uid, which names the run's completion record),
and the job runs a lighthouse pod (:func:`render_lighthouse`) behind the ClusterIP Service
``<job>-lighthouse`` instead of the store. The pods also get
``DDPJOB_FAULT_TOLERANCE`` (``PerStep``), ``TORCHFT_LIGHTHOUSE`` (that Service's URL),
``REPLICA_GROUP_ID`` (the node index), ``NUM_REPLICA_GROUPS`` (``spec.nodes``),
``DDPJOB_MIN_GROUPS`` and ``DDPJOB_GROUP_TIMEOUT_S`` (``ddp_api.contract``); everything else
is as above.

Read by the bundled trainer but not set by the operator (``spec.template.env`` may set it):
``DDPJOB_EXIT_BARRIER_S``, how long torchrun's agent waits at its exit barrier for the other
nodes once its workers finished (``ddp_trainer.node``; default 30, torchrun's own is 300); and
``DDPJOB_LOG_FILES``/``DDPJOB_LOG_FILE_MIB``, how much of each node's log is kept in
``<DDPJOB_CHECKPOINT_DIR>/logs/`` (``ddp_trainer.launch.keptlog``; default 5 files of 10 MiB, 0
files keeps none). Only a pod that runs ``ddp_trainer.node`` keeps its log: the bundled trainer's,
or a user's command that runs it; a pod without a checkpoint volume keeps none.

The user's ``spec.template.env`` comes last; ``LOGLEVEL``, ``PET_TEE``,
``PET_LOG_LINE_PREFIX_TEMPLATE``, ``PYTHONUNBUFFERED`` and ``OMP_NUM_THREADS`` are left out
when it sets them.

Identity: a pod of the bundled trainer runs as its namespace's ServiceAccount
``ddp-trainer-progress``, which may patch pods, narrowed by the chart's ValidatingAdmissionPolicy
to one change: the annotation ``ddp.dev/progress`` of the pod its token is bound to. Where the
operator does not see that policy (``OperatorConfig.progress_in_pod`` false), it runs as the
job's own account ``<job>-trainer``, whose Role may patch the ConfigMap ``<job>-progress`` and
nothing else. Either way the operator validates what rank 0 writes and copies it into
``status.progress`` (it is the only writer of a DDPJob's status). A pod running the user's own
command gets no Kubernetes credential at all (``automountServiceAccountToken: false``), nor does
the store pod; ``spec.template``'s ``serviceAccountName`` replaces all this with the user's own
account.

Container ports of a worker: ``c10d`` (29400), and ``metrics`` (``spec.trainer.metricsPort``,
default 9400) where the bundled trainer's first process serves Prometheus metrics; not declared
when the port is 0 or the pod runs the user's own command.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ddp_api import contract
from ddp_api.ddpjob import DDPJob, Spread
from ddp_api.metav1 import owner_reference
from ddp_api.pods import (
    CONTAINER,
    DEFAULT_IMAGE,
    LABEL_INDEX,
    LABEL_JOB,
    LABEL_ROLE,
    LOG_LINE_PREFIX_TEMPLATE,
    RESTRICTED_CONTAINER,
    RESTRICTED_POD,
    ROLE_WORKER,
    worker_name,
)

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
# of its namespace: its pods keep it until they end (see TrainerObjects.retire_legacy).
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


def _owned(job: DDPJob, name: str) -> dict[str, Any]:
    """The metadata of an object that belongs to ``job`` and goes with it, pods aside."""
    ns, job_name, _ = job_key(job)
    return {
        "name": name,
        "namespace": ns,
        "labels": {LABEL_JOB: job_name},
        "ownerReferences": [owner_reference(job.metadata)],
    }


def _meta(job: DDPJob, name: str, role: str, extra: dict[str, str] | None = None) -> dict:
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


def render_services(job: DDPJob) -> list[dict[str, Any]]:
    """The rendezvous Service (published before any pod is ready), or a PerStep job's
    lighthouse Service, and the workers' Service."""
    _, name, _ = job_key(job)
    c10d = {"name": "c10d", "port": contract.RDZV_PORT, "targetPort": contract.RDZV_PORT}
    lighthouse = {
        "name": LIGHTHOUSE_PORT_NAME,
        "port": contract.LIGHTHOUSE_PORT,
        "targetPort": contract.LIGHTHOUSE_PORT,
    }
    # A ClusterIP, not headless: the name keeps resolving while the pod behind it is replaced
    # (a headless name vanishes with the pod, and resolvers cache that for the zone's negative
    # TTL, 5 to 30 s); kube-proxy refuses connections until the new pod has an IP, then routes
    # to it.
    beacon = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(job, contract.lighthouse_name(name), ROLE_LIGHTHOUSE),
        "spec": {
            "type": "ClusterIP",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_JOB: name, LABEL_ROLE: ROLE_LIGHTHOUSE},
            "ports": [lighthouse],
        },
    }
    rdzv = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(job, store_name(name), ROLE_STORE),
        "spec": {
            "type": "ClusterIP",  # as the lighthouse's, above
            "publishNotReadyAddresses": True,
            "selector": {LABEL_JOB: name, LABEL_ROLE: ROLE_STORE},
            "ports": [dict(c10d)],
        },
    }
    workers = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(job, name, ROLE_WORKER),
        "spec": {
            # Gives every worker a DNS name <pod>.<job>.<namespace>.svc for debugging tools.
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_JOB: name, LABEL_ROLE: ROLE_WORKER},
            "ports": [dict(c10d)],
        },
    }
    return [beacon if job.spec.per_step else rdzv, workers]


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


def worker_ports(job: DDPJob) -> list[dict[str, Any]]:
    ports: list[dict[str, Any]] = [{"name": "c10d", "containerPort": contract.RDZV_PORT}]
    port = metrics_port(job)
    if port is not None:
        ports.append({"name": contract.METRICS_PORT_NAME, "containerPort": port})
    return ports


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


def lighthouse_command(job: DDPJob) -> list[str]:
    """``torchft_lighthouse`` for a PerStep job: a quorum needs ``minGroups`` groups; it is
    issued once every group still heartbeating has asked, or :data:`LIGHTHOUSE_JOIN_TIMEOUT_MS`
    after the first asked (a group still healing or starting joins the next step); a group
    silent for ``groupTimeoutSeconds`` is dropped."""
    ft = job.spec.fault_tolerance
    assert ft is not None
    return [
        "torchft_lighthouse",
        "--min_replicas",
        str(ft.groups_min),
        "--join_timeout_ms",
        str(LIGHTHOUSE_JOIN_TIMEOUT_MS),
        "--quorum_tick_ms",
        str(LIGHTHOUSE_QUORUM_TICK_MS),
        "--heartbeat_timeout_ms",
        str(ft.group_timeout_s * 1000),
        "--bind",
        f"[::]:{contract.LIGHTHOUSE_PORT}",
    ]


def render_lighthouse(job: DDPJob, cfg: OperatorConfig) -> dict[str, Any]:
    """A PerStep job's lighthouse pod: the torchft quorum server of its replica groups, shaped
    like the store pod (restricted, no credential, the job's image, not spread). Its state is
    the groups' heartbeats, which they send again to its successor."""
    _, name, _ = job_key(job)
    port = contract.LIGHTHOUSE_PORT
    container: dict[str, Any] = {
        "name": LIGHTHOUSE_CONTAINER,
        "command": lighthouse_command(job),
        "ports": [{"name": LIGHTHOUSE_PORT_NAME, "containerPort": port}],
        "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 2},
    }
    # restartPolicy Always: the groups heartbeat to a restarted one at once
    return _server_pod(job, cfg, contract.lighthouse_name(name), ROLE_LIGHTHOUSE, container)


def _server_pod(
    job: DDPJob, cfg: OperatorConfig, name: str, role: str, container: dict[str, Any]
) -> dict[str, Any]:
    """A job's small server pod (the rendezvous store or the lighthouse) around ``container``:
    the job's image, a small request, restricted, no credential, restarted in place."""
    s = job.spec
    container = {
        **container,
        "image": s.image or cfg.default_image,
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
        "securityContext": dict(RESTRICTED_CONTAINER),
    }
    if s.image_pull_policy:
        container["imagePullPolicy"] = s.image_pull_policy
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _meta(job, name, role),
        "spec": {
            "restartPolicy": "Always",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 5,
            "securityContext": dict(RESTRICTED_POD),
            "containers": [container],
            **_pod_spec_overrides(job),
        },
    }


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


def _pod_spec_overrides(job: DDPJob) -> dict[str, Any]:
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


def spread_constraints(job: DDPJob) -> list[dict[str, Any]]:
    """The node pods' topologySpreadConstraints: the user's own (``spec.template``), then one on
    the machine (``spec.spread``) unless the user's include one on kubernetes.io/hostname.

    maxSkew 1 rather than a required pod anti-affinity: with no more pods than machines each
    pod gets a machine of its own, and with more they stay even instead of Pending forever.
    Honoring taints and node affinity keeps machines the pods may not run on (a control
    plane, a lost machine) from counting as empty machines that every pod must wait for."""
    t, spread = job.spec.template, job.spec.spread
    own = [dict(c) for c in (t.topology_spread_constraints if t else None) or []]
    if spread == Spread.NONE or any(c.get("topologyKey") == HOSTNAME_KEY for c in own):
        return own
    _, name, _ = job_key(job)
    unsatisfiable = "DoNotSchedule" if spread == Spread.REQUIRED else "ScheduleAnyway"
    machine = {
        "maxSkew": 1,
        "topologyKey": HOSTNAME_KEY,
        "whenUnsatisfiable": unsatisfiable,
        "labelSelector": {"matchLabels": {LABEL_JOB: name, LABEL_ROLE: ROLE_WORKER}},
        "nodeAffinityPolicy": "Honor",
        "nodeTaintsPolicy": "Honor",
    }
    return [*own, machine]


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
    meta = _meta(job, worker_name(name, index), ROLE_WORKER, {LABEL_INDEX: str(index)})
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
            "terminationGracePeriodSeconds": cfg.termination_grace_s,
            "securityContext": dict(RESTRICTED_POD),
            "containers": [container],
            "volumes": volumes,
            **_pod_spec_overrides(job),
            **({"topologySpreadConstraints": spread} if spread else {}),
        },
    }


def render_store(job: DDPJob, cfg: OperatorConfig) -> dict[str, Any]:
    """The small pod that holds the c10d rendezvous store, outliving any trainer pod."""
    _, name, _ = job_key(job)
    container: dict[str, Any] = {
        "name": STORE_CONTAINER,
        "command": ["python", "-m", "ddp_trainer.rdzv_store"],
        "args": ["--host", "0.0.0.0", "--port", str(contract.RDZV_PORT)],
        "ports": [{"name": "c10d", "containerPort": contract.RDZV_PORT}],
    }
    # restartPolicy Always: a restarted store is a new, empty rendezvous
    return _server_pod(job, cfg, store_name(name), ROLE_STORE, container)


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


# -- the trainer's narrow permission: rank 0 reports its own job's progress ----------------------
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
        "metadata": _owned(job, contract.progress_configmap(name)),
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
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _owned(job, account)},
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "Role",
            "metadata": _owned(job, account),
            "rules": [rule],
        },
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "RoleBinding",
            "metadata": _owned(job, account),
            "roleRef": {"apiGroup": rbac, "kind": "Role", "name": account},
            "subjects": [subject],
        },
    ]
