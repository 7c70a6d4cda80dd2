"""The operator's own settings, read once at start-up from its environment (the chart sets them).

A value that cannot be read stops the operator at start-up, naming the variable and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .plan import COMPLETION_GRACE_S, NODE_LOST_GRACE_S
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

        def flag(name: str) -> bool:
            text = (environ.get(name) or "false").strip().lower()
            if text not in ("true", "false"):
                raise ValueError(f"{name}={environ.get(name)!r} must be true or false")
            return text == "true"

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
        )
