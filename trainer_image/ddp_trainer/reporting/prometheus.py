"""Prometheus metrics of the trainer: what one process measures, in a registry of its own, and
the endpoint that serves them (the first process of each node, on ``metricsPort``; 0 = off).

Metrics never stop training: an update that fails is logged once and dropped, and a port that
cannot be bound is logged once and left alone. The metrics carry no labels: every endpoint is
one pod of one job, and Prometheus adds ``namespace``/``pod`` (and the pod label
``ddp.dev/job-name``, if asked) to what it scrapes. A ``job`` label of our own would collide with
Prometheus's own ``job`` label and be renamed ``exported_job``. Names: docs/metrics.md.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from ddp_api.contract import ENV_POD_IP

if TYPE_CHECKING:
    from ddp_trainer.distributed import DistEnv

log = logging.getLogger("ddp_trainer.metrics")

PREFIX = "ddp_trainer_"
# Anywhere from a toy model on a CPU (milliseconds) to a large one (a minute) per step.
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CHECKPOINT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

F = TypeVar("F", bound=Callable[..., None])


def _never_raises(method: F) -> F:
    """An update that fails is logged once (per metrics object) and otherwise ignored."""

    @functools.wraps(method)
    def guarded(self: TrainerMetrics, *args: Any, **kwargs: Any) -> None:
        try:
            method(self, *args, **kwargs)
        except Exception as error:
            if not self._warned:
                self._warned = True
                log.warning(
                    "updating the Prometheus metrics failed in %s (training goes on): %r",
                    method.__name__,
                    error,
                )

    return cast(F, guarded)


class TrainerMetrics:
    """The metrics of one trainer process. Every process keeps them; the first process of a
    node serves them. Checkpoint metrics exist only in global rank 0, the only writer (PerStep
    mode: local rank 0 of every group, since the writer is whichever group is participating
    rank 0 of the last quorum); ``ddp_trainer_replica_groups`` in PerStep mode only."""

    def __init__(self, *, is_main: bool, world_size: int, restarts: int, per_step: bool = False):
        self.is_main = is_main
        self.per_step = per_step
        self._warned = False
        self.registry = CollectorRegistry()
        r = self.registry
        self.step_seconds = Histogram(
            PREFIX + "step_seconds",
            "Wall time of one optimizer step in this process: data, forward, backward, gradient "
            "all-reduce and optimizer update.",
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.step = Gauge(
            PREFIX + "step",
            "Optimizer steps done, counting those before a resume (status.progress.step).",
            registry=r,
        )
        self.total_steps = Gauge(
            PREFIX + "total_steps", "Optimizer steps at which the run ends.", registry=r
        )
        self.epoch = Gauge(PREFIX + "epoch", "Current epoch (0-based).", registry=r)
        self.samples_per_second = Gauge(
            PREFIX + "samples_per_second",
            "Training samples per second of all processes together, over the steps since the "
            "previous log point (every logEverySteps steps).",
            registry=r,
        )
        self.loss = Gauge(
            PREFIX + "loss",
            "Training loss, the mean over every sample (or token) of every process since the "
            "previous log point (every logEverySteps steps).",
            registry=r,
        )
        self.learning_rate = Gauge(
            PREFIX + "learning_rate", "Learning rate of the latest optimizer step.", registry=r
        )
        self.grad_norm = Gauge(
            PREFIX + "grad_norm",
            "Global L2 norm of the gradient of the latest step (after unscaling, before "
            "clipping to gradClipNorm).",
            registry=r,
        )
        self.non_finite_steps = Counter(
            PREFIX + "non_finite_steps",
            "Steps skipped in this process because their loss or gradient was not finite "
            "(trainer.maxNonFiniteSteps in a row fail the run); the fp16 GradScaler's own "
            "skips are not counted.",
            registry=r,
        )
        self.world_size = Gauge(
            PREFIX + "world_size",
            "Training processes in the job (all nodes; PerStep mode: of the replica groups that"
            " trained the latest committed step).",
            registry=r,
        )
        self.world_size.set(world_size)
        if per_step:
            self.replica_groups = Gauge(
                PREFIX + "replica_groups",
                "PerStep mode: replica groups (node pods) that trained the latest committed step.",
                registry=r,
            )
        worker_restarts = Gauge(
            PREFIX + "worker_restarts",
            "Times torchrun restarted this node's workers before this process started "
            "(TORCHELASTIC_RESTART_COUNT): membership changes and worker failures.",
            registry=r,
        )
        worker_restarts.set(restarts)
        if not is_main:
            return
        self.checkpoint_seconds = Histogram(
            PREFIX + "checkpoint_seconds",
            "Time to write one checkpoint (serialize, write, fsync, rename, manifest); "
            "periodic checkpoints are written in the background. Global rank 0 only.",
            buckets=CHECKPOINT_BUCKETS,
            registry=r,
        )
        self.checkpoint_blocked_seconds = Histogram(
            PREFIX + "checkpoint_blocked_seconds",
            "Time the training loop waited for one checkpoint: the copy to CPU, or the whole "
            "write when synchronous (at the end, on SIGTERM). Global rank 0 only.",
            buckets=CHECKPOINT_BUCKETS,
            registry=r,
        )
        self.checkpoint_bytes = Gauge(
            PREFIX + "checkpoint_bytes",
            "Size of the newest checkpoint written, in bytes. Global rank 0 only.",
            registry=r,
        )
        self.last_checkpoint_step = Gauge(
            PREFIX + "last_checkpoint_step",
            "Step of the newest complete checkpoint, written or resumed from (0: none yet). "
            "Global rank 0 only.",
            registry=r,
        )
        self.checkpoint_failures = Counter(
            PREFIX + "checkpoint_failures",
            "Checkpoint writes that failed (the step was not saved; the next checkpoint is "
            "written synchronously). Global rank 0 only.",
            registry=r,
        )

    @_never_raises
    def started(self, *, step: int, epoch: int, total_steps: int, resumed_step: int | None) -> None:
        """The position a run starts from (after a resume), and the checkpoint it resumed."""
        self.step.set(step)
        self.epoch.set(epoch)
        self.total_steps.set(total_steps)
        if self.is_main and resumed_step is not None:
            self.last_checkpoint_step.set(resumed_step)

    @_never_raises
    def step_done(
        self, *, seconds: float, step: int, epoch: int, lr: float, grad_norm: float | None = None
    ) -> None:
        self.step_seconds.observe(seconds)
        self.step.set(step)
        self.epoch.set(epoch)
        self.learning_rate.set(lr)
        if grad_norm is not None:
            self.grad_norm.set(grad_norm)

    @_never_raises
    def membership(self, *, world_size: int, groups: int | None) -> None:
        """Who trained the latest step (PerStep mode: the groups of its quorum, which change
        while the process runs)."""
        self.world_size.set(world_size)
        if self.per_step and groups is not None:
            self.replica_groups.set(groups)

    @_never_raises
    def non_finite_step(self) -> None:
        self.non_finite_steps.inc()

    @_never_raises
    def progress(self, *, loss: float, samples_per_second: float) -> None:
        self.loss.set(loss)
        self.samples_per_second.set(samples_per_second)

    @_never_raises
    def checkpoint_blocked(self, seconds: float) -> None:
        if self.is_main:
            self.checkpoint_blocked_seconds.observe(seconds)

    @_never_raises
    def checkpoint_written(self, *, step: int, seconds: float, size: int | None) -> None:
        """A checkpoint is complete (called from the writer thread for periodic ones)."""
        if not self.is_main:
            return
        self.checkpoint_seconds.observe(seconds)
        if size is not None:
            self.checkpoint_bytes.set(size)
        self.last_checkpoint_step.set(step)

    @_never_raises
    def checkpoint_failed(self) -> None:
        """A checkpoint write failed (called from the writer thread for periodic ones)."""
        if self.is_main:
            self.checkpoint_failures.inc()


def process_metrics(env: DistEnv, per_step: bool = False) -> TrainerMetrics:
    """The metrics of this process of the run (see :class:`TrainerMetrics`)."""
    return TrainerMetrics(
        is_main=env.rank == 0,
        world_size=env.world_size,
        restarts=env.restart_count,
        per_step=per_step,
    )


def listen_address(environ: Mapping[str, str]) -> str:
    """Every address of the pod: IPv4's wildcard, or IPv6's (which takes IPv4 too) where the
    pod's IP is IPv6; never the pod IP alone, so that `kubectl port-forward` still reaches it."""
    return "::" if ":" in environ.get(ENV_POD_IP, "") else "0.0.0.0"


def serve(registry: CollectorRegistry, port: int, address: str = "0.0.0.0") -> Any | None:
    """Serves ``registry`` at ``http://address:port/metrics`` from a daemon thread; returns the
    server, or None when ``port`` is 0 or cannot be bound (logged once; training goes on)."""
    if port == 0:
        return None
    try:
        server, _ = start_http_server(port, addr=address, registry=registry)
    except Exception as error:
        log.warning(
            "cannot serve Prometheus metrics on port %d (training goes on without them): %s",
            port,
            error,
        )
        return None
    host = f"[{address}]" if ":" in address else address
    log.info("serving Prometheus metrics at http://%s:%d/metrics", host, port)
    return server
