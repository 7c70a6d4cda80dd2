"""The operator's own settings, read once at start-up from its environment (the chart sets them).

A value that cannot be read stops the operator at start-up, naming the variable and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .leadership import Durations
from .planner.completion import COMPLETION_GRACE_S
from .planner.lost_machines import NODE_LOST_GRACE_S
from .render import DEFAULT_TRAINER_POLICY, OperatorConfig


@dataclass(frozen=True)
class Settings:
    """Everything the operator is configured with; see the README's operator section."""

    render: OperatorConfig = field(default_factory=OperatorConfig)
    backoff_base_s: float = 10.0  # first delay before a failed pod is recreated; doubles after
    # Once a node finished training, how long the others get to finish before they are stopped.
    completion_grace_s: float = COMPLETION_GRACE_S
    # A machine (Node) not Ready this long, or silent this long (no Lease renewal; at least
    # 20 s), loses its job pods at once (deleted with grace 0).
    node_lost_grace_s: float = NODE_LOST_GRACE_S
    resync_s: float = 30.0  # every job is reconciled at least this often
    workers: int = 48  # API requests in flight
    metrics_port: int = 8081  # Prometheus /metrics; 0 serves none
    # Kueue: jobs labelled kueue.x-k8s.io/queue-name wait for admission (needs the chart's
    # kueue.enabled RBAC); off, the operator never reads or writes Kueue's objects.
    kueue: bool = False
    # The chart's ClusterRole for the namespaces' trainer account, and the admission policy
    # (and its binding) that confines it: all three share this name, the release's.
    trainer_policy: str = DEFAULT_TRAINER_POLICY
    # Leader election (docs/design.md, "The operator's own failures"): the replica that holds
    # the Lease lease_namespace/lease_name acts; off, this process acts alone (one replica only).
    leader_election: bool = True
    lease_name: str = "ddp-operator"
    lease_namespace: str = "ddp-system"  # the chart sets the release's namespace
    # Unique per process (the chart: the pod's name; a restarted container of the same pod takes
    # its Lease back at once); "": this machine's hostname and a random suffix, made at start.
    identity: str = ""
    lease: Durations = field(default_factory=Durations)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        defaults, rendering = cls(), OperatorConfig()

        def number(name: str, default: float, minimum: float) -> float:
            text = environ.get(name)
            if text is None or text == "":
                return default
            try:
                value = float(text)
            except ValueError:
                raise ValueError(
                    f"{name}={text!r} is not a number; unset it for {default}"
                ) from None
            if value < minimum:
                raise ValueError(f"{name}={text!r} must be at least {minimum:g}")
            return value

        def flag(name: str, default: str = "false") -> bool:
            text = (environ.get(name) or default).strip().lower()
            if text not in ("true", "false"):
                raise ValueError(f"{name}={environ.get(name)!r} must be true or false")
            return text == "true"

        lease = Durations(
            lease_s=number("DDP_LEASE_DURATION_S", defaults.lease.lease_s, 1),
            renew_deadline_s=number("DDP_RENEW_DEADLINE_S", defaults.lease.renew_deadline_s, 0.1),
            retry_s=number("DDP_RETRY_PERIOD_S", defaults.lease.retry_s, 0.05),
        )
        for problem in lease.problems():
            raise ValueError(
                f"DDP_LEASE_DURATION_S={lease.lease_s:g}, DDP_RENEW_DEADLINE_S="
                f"{lease.renew_deadline_s:g}, DDP_RETRY_PERIOD_S={lease.retry_s:g}: {problem}"
            )
        return cls(
            render=OperatorConfig(
                default_image=environ.get("DDP_DEFAULT_IMAGE") or rendering.default_image,
                monitor_interval_s=number(
                    "DDP_MONITOR_INTERVAL_S", rendering.monitor_interval_s, 0.1
                ),
            ),
            backoff_base_s=number("DDP_BACKOFF_BASE_S", defaults.backoff_base_s, 0),
            completion_grace_s=number("DDP_COMPLETION_GRACE_S", defaults.completion_grace_s, 0),
            node_lost_grace_s=number("DDP_NODE_LOST_GRACE_S", defaults.node_lost_grace_s, 0),
            resync_s=number("DDP_RESYNC_S", defaults.resync_s, 1),
            workers=int(number("DDP_WORKERS", defaults.workers, 1)),
            metrics_port=int(number("DDP_METRICS_PORT", defaults.metrics_port, 0)),
            kueue=flag("DDP_KUEUE"),
            trainer_policy=environ.get("DDP_TRAINER_POLICY") or defaults.trainer_policy,
            leader_election=flag("DDP_LEADER_ELECTION", "true"),
            lease_name=environ.get("DDP_LEASE_NAME") or defaults.lease_name,
            lease_namespace=environ.get("DDP_LEASE_NAMESPACE") or defaults.lease_namespace,
            identity=environ.get("DDP_LEADER_IDENTITY") or "",
            lease=lease,
        )
