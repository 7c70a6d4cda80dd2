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
PET_SHUTDOWN_TIMEOUT            how long torchrun waits for its workers after passing them the
                                pod's SIGTERM, before its SIGKILL: the pod's grace period less
                                2 s (torchrun's own: 30 s, which killed a slower SIGTERM save)
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
RES_OPTIONS                     ``timeout:1 attempts:2`` (glibc's resolver; its own: two 5 s
                                tries): c10d looks up the name of every TCPStore peer, and a
                                lookup sent to a lost machine's DNS server held a store past a
                                PerStep group's 5 s connect; the store pod gets it too
                                (``RESOLVER_OPTIONS``)
==============================  ================================================================

A lost machine sends nothing (no FIN, no RST), and torchrun's agent re-rendezvouses only when a
worker fails or a new node waits: a peer's keep-alive going stale changes nothing for a round in
progress. Survivors of the bundled trainer notice a silent peer within its ``stepTimeoutS``
(60 s): once every rank has taken its first step, their next collective times out; before that,
the peer's beats in torchrun's store stop (``ddp_trainer.start_watch``); the end needs no
collective (``ddp_trainer.end_together``). Their workers then fail, torchrun starts them again
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
``PET_LOG_LINE_PREFIX_TEMPLATE``, ``PYTHONUNBUFFERED``, ``PET_SHUTDOWN_TIMEOUT``,
``OMP_NUM_THREADS`` and ``RES_OPTIONS`` are left out when it sets them.

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

from ddp_api.pods import (
    CONTAINER,
    LABEL_INDEX,
    LABEL_JOB,
    LABEL_ROLE,
    ROLE_WORKER,
    worker_name,
)

from .common import (
    ANNOTATION_ATTEMPT,
    DEFAULT_TRAINER_POLICY,
    HOSTNAME_KEY,
    LEGACY_TRAINER_ACCOUNT,
    LIGHTHOUSE_CONTAINER,
    LIGHTHOUSE_JOIN_TIMEOUT_MS,
    LIGHTHOUSE_PORT_NAME,
    LIGHTHOUSE_QUORUM_TICK_MS,
    PROGRESS_ACCOUNT,
    RDZV_CONF,
    RESOLVER_OPTIONS,
    ROLE_LIGHTHOUSE,
    ROLE_STORE,
    SHM_SIZE,
    STORE_CONTAINER,
    OperatorConfig,
    job_key,
    pod_spec_overrides,
    rdzv_endpoint,
    store_name,
    trainer_account,
)
from .env import (
    cpu_quantity,
    cpu_threads_per_process,
    fault_tolerance_env,
    metrics_port,
    trainer_config_json,
    worker_env,
)
from .identity import (
    render_namespace_trainer,
    render_progress_configmap,
    render_trainer_identity,
    reports_progress,
    uses_trainer_account,
)
from .servers import lighthouse_command, render_lighthouse, render_services, render_store
from .worker import machine_constraint, render_worker, spread_constraints, worker_ports

__all__ = [
    "ANNOTATION_ATTEMPT",
    "CONTAINER",
    "DEFAULT_TRAINER_POLICY",
    "HOSTNAME_KEY",
    "LABEL_INDEX",
    "LABEL_JOB",
    "LABEL_ROLE",
    "LEGACY_TRAINER_ACCOUNT",
    "LIGHTHOUSE_CONTAINER",
    "LIGHTHOUSE_JOIN_TIMEOUT_MS",
    "LIGHTHOUSE_PORT_NAME",
    "LIGHTHOUSE_QUORUM_TICK_MS",
    "PROGRESS_ACCOUNT",
    "RDZV_CONF",
    "RESOLVER_OPTIONS",
    "ROLE_LIGHTHOUSE",
    "ROLE_STORE",
    "ROLE_WORKER",
    "SHM_SIZE",
    "STORE_CONTAINER",
    "OperatorConfig",
    "cpu_quantity",
    "cpu_threads_per_process",
    "fault_tolerance_env",
    "job_key",
    "lighthouse_command",
    "machine_constraint",
    "metrics_port",
    "pod_spec_overrides",
    "rdzv_endpoint",
    "render_lighthouse",
    "render_namespace_trainer",
    "render_progress_configmap",
    "render_services",
    "render_store",
    "render_trainer_identity",
    "render_worker",
    "reports_progress",
    "spread_constraints",
    "store_name",
    "trainer_account",
    "trainer_config_json",
    "uses_trainer_account",
    "worker_env",
    "worker_name",
    "worker_ports",
]
