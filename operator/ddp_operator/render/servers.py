"""A job's Services and its small server pods: the rendezvous store (Restart mode) or the
torchft lighthouse (PerStep)."""

from __future__ import annotations

from typing import Any

from ddp_api import contract, rdzv_store
from ddp_api.ddpjob import DDPJob
from ddp_api.pods import LABEL_JOB, LABEL_ROLE, RESTRICTED_CONTAINER, RESTRICTED_POD, ROLE_WORKER

from .common import (
    LIGHTHOUSE_CONTAINER,
    LIGHTHOUSE_JOIN_TIMEOUT_MS,
    LIGHTHOUSE_PORT_NAME,
    LIGHTHOUSE_QUORUM_TICK_MS,
    RESOLVER_OPTIONS,
    ROLE_LIGHTHOUSE,
    ROLE_STORE,
    STORE_CONTAINER,
    OperatorConfig,
    job_key,
    pod_spec_overrides,
    role_meta,
    store_name,
    user_env_value,
)

SERVER_READY_AFTER_S = 5  # a server's first readiness probe, after it started


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
        "metadata": role_meta(job, contract.lighthouse_name(name), ROLE_LIGHTHOUSE),
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
        "metadata": role_meta(job, store_name(name), ROLE_STORE),
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
        "metadata": role_meta(job, name, ROLE_WORKER),
        "spec": {
            # Gives every worker a DNS name <pod>.<job>.<namespace>.svc for debugging tools.
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_JOB: name, LABEL_ROLE: ROLE_WORKER},
            "ports": [dict(c10d)],
        },
    }
    return [beacon if job.spec.per_step else rdzv, workers]


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


def lighthouse_log_level(job: DDPJob) -> str:
    """The lighthouse's ``RUST_LOG``: ``spec.template.env``'s when it names one, else ``warn``.
    At torchft's default, ``info``, it writes about seven lines for every step (each group's
    quorum request, each quorum), which bury its warnings and fill the machine's log files
    (17,000 lines in a 2,400-step charlm run on kind)."""
    return user_env_value(job, "RUST_LOG", "warn")


def render_lighthouse(job: DDPJob, cfg: OperatorConfig) -> dict[str, Any]:
    """A PerStep job's lighthouse pod: the torchft quorum server of its replica groups, shaped
    like the store pod (restricted, no credential, the job's image, not spread). Its state is
    the groups' heartbeats, which they send again to its successor."""
    _, name, _ = job_key(job)
    port = contract.LIGHTHOUSE_PORT
    container: dict[str, Any] = {
        "name": LIGHTHOUSE_CONTAINER,
        "command": lighthouse_command(job),
        "env": [{"name": "RUST_LOG", "value": lighthouse_log_level(job)}],
        "ports": [{"name": LIGHTHOUSE_PORT_NAME, "containerPort": port}],
    }
    # restartPolicy Always: the groups heartbeat to a restarted one at once
    return _server_pod(job, cfg, contract.lighthouse_name(name), ROLE_LIGHTHOUSE, container)


def _server_pod(
    job: DDPJob, cfg: OperatorConfig, name: str, role: str, container: dict[str, Any]
) -> dict[str, Any]:
    """A job's small server pod (the rendezvous store or the lighthouse) around ``container``:
    the job's image, a small request, restricted, no credential, restarted in place."""
    s = job.spec
    port = container["ports"][0]["containerPort"]
    container = {
        **container,
        "image": s.image or cfg.default_image,
        # Ready once it listens (its Service publishes it before: publishNotReadyAddresses). A
        # server that keeps failing is one restarted and not ready since (ServerFailing): with
        # no probe a container is ready while it runs, so each moment's run between crashes
        # would clear the problem and a new start of it would say it again. First probed after
        # 5 s: a store imports torch first (2.6 s on kind), and each refused probe is a Warning
        # event (Unhealthy) on a healthy pod.
        "readinessProbe": {
            "tcpSocket": {"port": port},
            "initialDelaySeconds": SERVER_READY_AFTER_S,
            "periodSeconds": 2,
        },
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
        "securityContext": dict(RESTRICTED_CONTAINER),
        # Its log's tail as the message of a failed start: the job then says why it fails.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if s.image_pull_policy:
        container["imagePullPolicy"] = s.image_pull_policy
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": role_meta(job, name, role),
        "spec": {
            "restartPolicy": "Always",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 5,
            "securityContext": dict(RESTRICTED_POD),
            "containers": [container],
            **pod_spec_overrides(job),
        },
    }


def render_store(job: DDPJob, cfg: OperatorConfig) -> dict[str, Any]:
    """The small pod that holds the c10d rendezvous store, outliving any trainer pod."""
    _, name, _ = job_key(job)
    container: dict[str, Any] = {
        "name": STORE_CONTAINER,
        # In the job's image, which may be the user's: a program that needs only torch.
        "command": ["python3", "-c", rdzv_store.program()],
        "args": ["--host", "0.0.0.0", "--port", str(contract.RDZV_PORT)],
        "ports": [{"name": "c10d", "containerPort": contract.RDZV_PORT}],
        # Its one server thread looks up the name of every node that connects: a lookup that
        # fails holds the rendezvous 2 s, not 10 (RESOLVER_OPTIONS).
        # The user's own, as on the node pods.
        "env": [
            {"name": "RES_OPTIONS", "value": user_env_value(job, "RES_OPTIONS", RESOLVER_OPTIONS)}
        ],
    }
    # restartPolicy Always: a restarted store is a new, empty rendezvous
    return _server_pod(job, cfg, store_name(name), ROLE_STORE, container)
