"""The operator's Prometheus metrics (``/metrics`` on ``DDP_METRICS_PORT``, 8081 by default).

One registry of its own, served from a thread by ``prometheus_client``. Labels are bounded:
a namespace, a phase, a restart reason or an HTTP status code, never a job or pod name. The
controller feeds the counters and histograms; the jobs-by-phase gauge is counted from the job
index at scrape time (:func:`phase_counts`), so it is never out of step with what the operator
holds. docs/metrics.md lists every metric.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ddp_api.ddpjob import DDPJobPhase

log = logging.getLogger("ddp_operator")

# Seconds from a job's creation: its pods are created within a second or two; its first step
# comes after image pulls, torchrun's rendezvous and the first batches, minutes on a big image.
STARTUP_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800)
# Seconds from an incident's detection until training went on: a restart is tens of seconds.
RECOVERY_BUCKETS = (1, 2, 5, 10, 20, 30, 45, 60, 90, 120, 300, 600, 1800)
REDONE_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
PHASES = tuple(p.value for p in DDPJobPhase)


def phase_counts(jobs: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], int]:
    """(namespace, phase) -> jobs, with every phase of each namespace that has a job (0 when
    none), so a series drops to 0 instead of vanishing. A job without a phase yet is Pending."""
    tally: Tally[tuple[str, str]] = Tally()
    namespaces: set[str] = set()
    for job in jobs:
        ns = str((job.get("metadata") or {}).get("namespace") or "")
        phase = (job.get("status") or {}).get("phase") or DDPJobPhase.PENDING.value
        namespaces.add(ns)
        tally[(ns, str(phase))] += 1
    return {(ns, phase): tally[(ns, phase)] for ns in sorted(namespaces) for phase in PHASES}


class JobsByPhase(Collector):
    """``ddp_operator_jobs``, counted from ``jobs()`` (the operator's job index) when scraped."""

    def __init__(self, jobs: Callable[[], Iterable[Mapping[str, Any]]]):
        self.jobs = jobs

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "ddp_operator_jobs",
            "DDPJobs the operator holds, by namespace and status.phase.",
            labels=["namespace", "phase"],
        )
        try:
            counts = phase_counts(self.jobs())
        except RuntimeError:  # the index changed while it was read: skip this scrape's series
            counts = {}
        for (ns, phase), n in counts.items():
            family.add_metric([ns, phase], n)
        yield family


class OperatorMetrics:
    """Every metric of the operator, on a registry of its own."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes
        self.job_pods_created = Histogram(
            "ddp_operator_job_pods_created_seconds",
            "From a DDPJob's creation (metadata.creationTimestamp, whole seconds) until the "
            "operator has created all of its first node pods.",
            buckets=STARTUP_BUCKETS,
            registry=r,
        )
        self.job_first_step = Histogram(
            "ddp_operator_job_first_step_seconds",
            "From a DDPJob's creation until the operator first sees a training step reported "
            "in status.progress.",
            buckets=STARTUP_BUCKETS,
            registry=r,
        )
        self.reconcile = Histogram(
            "ddp_operator_reconcile_duration_seconds",
            "Duration of one reconcile of one job: plan, creates, deletes, status, Events.",
            buckets=RECONCILE_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "ddp_operator_workqueue_depth",
            "Jobs being reconciled, due for another reconcile, or waiting for the pod and "
            "Service caches to fill.",
            registry=r,
        )
        self.pod_creates = Counter(
            "ddp_operator_pod_creates",
            "Pods the API server accepted from the operator.",
            registry=r,
        )
        self.pod_deletes = Counter(
            "ddp_operator_pod_deletes", "Pod deletions the operator sent.", registry=r
        )
        self.restarts = Counter(
            "ddp_operator_restarts",
            "Restarts counted against backoffLimit (status.restarts), by reason: PodFailed "
            "(a pod ended Failed) or PodDisrupted (a running pod was deleted by someone else).",
            ["reason"],
            registry=r,
        )
        self.recovery = Histogram(
            "ddp_operator_recovery_seconds",
            "From an incident's detection until rank 0 next reported a step (status.incidents), "
            "by kind: Failure, Disruption, NodeLost, Stalled, StoreLost, Resize.",
            ["kind"],
            buckets=RECOVERY_BUCKETS,
            registry=r,
        )
        self.steps_redone = Histogram(
            "ddp_operator_steps_redone",
            "Training steps done again after an incident (from its checkpoint to the step it "
            "stopped at), by kind.",
            ["kind"],
            buckets=REDONE_BUCKETS,
            registry=r,
        )
        self.api_errors = Counter(
            "ddp_operator_api_errors",
            "Answers from the API server other than 2xx, by HTTP status code (409 and 404 include "
            "the expected AlreadyExists and NotFound of idempotent creates and deletes), and "
            "'transport' for requests that got no answer.",
            ["code"],
            registry=r,
        )
        self.leader = Gauge(
            "ddp_operator_leader",
            "1 while this replica holds the leader Lease and acts, 0 while it stands by (its "
            "caches warm, writing nothing).",
            registry=r,
        )
        self._server: Any = None

    def incidents_closed(self, closed: Iterable[Mapping[str, Any]]) -> None:
        """Observes what each incident that a report closed cost."""
        for incident in closed:
            kind = str(incident.get("kind", ""))
            if incident.get("seconds") is not None:
                self.recovery.labels(kind).observe(float(incident["seconds"]))
            if incident.get("stepsRedone") is not None:
                self.steps_redone.labels(kind).observe(float(incident["stepsRedone"]))

    def watch_jobs(self, jobs: Callable[[], Iterable[Mapping[str, Any]]]) -> None:
        self.registry.register(JobsByPhase(jobs))

    def track_queue(self, depth: Callable[[], float]) -> None:
        self.queue_depth.set_function(depth)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Serves ``/metrics`` on ``port`` from a daemon thread; 0 serves nothing."""
        if port <= 0:
            return
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        self._server = server
        log.info("serving Prometheus metrics on :%d/metrics", port)

    def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            threading.Thread(target=server.shutdown, daemon=True).start()
