"""The controller: what a reconcile of one job reads, decides and does, and the parts it is
made of. The decisions are pure: :mod:`ddp_operator.planner` (what a job needs) and
:mod:`ddp_operator.bookkeeping` (what the controller believes and writes when);
:mod:`ddp_operator.handlers` wires this into kopf. Its parts, each of one job:
:mod:`~ddp_operator.reconciler` (one reconcile: read, plan, act),
:mod:`~ddp_operator.workqueue` (one reconcile of a job at a time, the clock),
:mod:`~ddp_operator.actions` (carrying out a plan), :mod:`~ddp_operator.machines` (Nodes and
their heartbeats), :mod:`~ddp_operator.kueue_workloads` (Kueue Workloads),
:mod:`~ddp_operator.trainer_objects` (the trainer pods' accounts, and the admission policy that
confines them: :mod:`~ddp_operator.progress_policy`), :mod:`~ddp_operator.progress_records`
(rank 0's reports), :mod:`~ddp_operator.startup` (the start-up histograms) and
:mod:`~ddp_operator.leadership` (which replica acts).

Idempotence: pod and Service names are deterministic, so a create that repeats (after a
restart) meets AlreadyExists and changes nothing; creates made but not yet seen by the watch
are remembered ("expectations"), and the status this process wrote last is preferred over a
staler one from the watch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import kopf

from ddp_api.metav1 import controller_uid

from . import informer, kube, queueing, render
from .actions import COMPONENT, Actions
from .kueue_workloads import KueueWorkloads
from .leadership import Elector
from .machines import Machines
from .metrics import OperatorMetrics
from .planner import placement, views
from .progress_records import ProgressRecords
from .reconciler import Reconciler
from .settings import Settings
from .startup import StartupTimes
from .trainer_objects import TrainerObjects
from .workqueue import Key, WorkQueue

log = logging.getLogger("ddp_operator")


@dataclass
class Controller:
    """The operator's memory between events; lost on restart, which only costs API calls.

    Built whole from its settings, its credentials and kopf's index of jobs: its API sessions
    (the controller's, gated by :meth:`acting`, and the elector's own) and every part exist
    from construction; :meth:`start` sets them running."""

    settings: Settings
    credentials: Callable[[], kopf.ConnectionInfo | None]
    jobs: kopf.Index[Any, Any]  # kopf's jobs_by_name index
    # This replica's name: in the Lease, and in its requests' user agent (audit logs).
    identity: str
    instance: str = COMPONENT  # reportingInstance of its Events: the pod's name in a cluster
    # Pods created but not yet seen by the watch: name -> when created.
    expected: dict[Key, dict[str, float]] = field(default_factory=dict)
    pods: informer.Cache[views.PodView] = field(
        default_factory=lambda: informer.Cache(render.LABEL_JOB, views.view)
    )
    # Each Service's controller (its uid; "" for none): an orphaned one is adopted.
    services: informer.Cache[str] = field(
        default_factory=lambda: informer.Cache(render.LABEL_JOB, _controller)
    )
    progress: ProgressRecords = field(default_factory=ProgressRecords)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    elector: Elector | None = field(init=False)  # None: no leader election, this one acts
    api: kube.Kube = field(init=False)  # every request but the elector's
    workloads: KueueWorkloads = field(init=False)  # queued jobs' Kueue Workloads
    trainer: TrainerObjects = field(init=False)  # the trainer pods' accounts (and ConfigMaps)
    actions: Actions = field(init=False)  # carries out each plan
    watches: informer.Watches = field(init=False)
    machines: Machines = field(init=False)  # Nodes and their heartbeats
    startup: StartupTimes = field(init=False)
    reconciler: Reconciler = field(init=False)  # one reconcile of a job
    queue: WorkQueue = field(init=False)

    def __post_init__(self) -> None:
        ours, agent = self.settings, f"{COMPONENT}/{self.identity}"
        self.elector = None
        if ours.leader_election:
            self.elector = Elector(
                kube.Kube(self.credentials, 1, attempts=1, user_agent=agent),  # never queued
                ours.lease_namespace,  # behind the controller's requests
                ours.lease_name,
                self.identity,
                ours.lease,
                self.leading,
            )
        self.api = kube.Kube(
            self.credentials,
            ours.workers,
            on_error=lambda code: self.metrics.api_errors.labels(code).inc(),
            may_write=self.acting,
            user_agent=agent,
        )
        self.workloads = KueueWorkloads(self.api)
        self.trainer = TrainerObjects(self.pods, self.api, self.spawn)
        self.pods.removed = self.progress.pod_removed  # a deleted pod's last report is kept
        self.actions = Actions(self.metrics, self.trainer, self.api, self.instance)
        caches: dict[str, informer.Cache[Any]] = {
            "pods": self.pods,
            "services": self.services,
            "configmaps": self.progress.cache,
        }
        if ours.kueue:
            caches[queueing.WORKLOADS] = self.workloads.cache
        self.watches = informer.Watches(
            self.api,
            caches,
            self.changed,
            lambda namespace: self.queue.release(namespace),
            api_versions={queueing.WORKLOADS: queueing.KUEUE_API},
        )
        self.machines = Machines(ours.node_lost_grace_s, self._machine_changed)
        self.startup = StartupTimes(self.metrics)
        self.reconciler = Reconciler(
            self.settings, self.expected, self.pods, self.services, self.progress, self.actions,
            self.trainer, self.workloads, self.machines, self.startup, self.spawn,
            lambda key, after_s: self.queue.later(key, after_s),
            lambda: [job for key in list(self.jobs) for job in self.jobs.get(key, [])],
        )  # fmt: skip
        self.queue = WorkQueue(
            self.reconciler.reconcile,
            lambda key: list(self.jobs.get(key, [])),
            lambda: list(self.jobs),
            self.watches.ready,
            self.spawn,
            self.metrics.reconcile.observe,
            self.acting,
        )
        self.metrics.leader.set(1 if self.elector is None else 0)  # the elector says when

    def acting(self) -> bool:
        """Whether this replica may write now: the gate of the API client and of reconciles."""
        return self.elector is None or self.elector.acting()

    def leading(self, now: bool) -> None:
        """This replica started (True) or stopped acting (the elector's transitions)."""
        self.metrics.leader.set(1 if now else 0)
        if now:
            self.queue.everything()  # from the warm caches, without waiting for events
            return
        # What this process remembers of its own writes may be older than another leader's.
        self.expected.clear()
        self.actions.written.clear()
        self.actions.status_written_at.clear()
        self.queue.due.clear()

    def start(self) -> None:
        """Runs the elector (if any), reads the trainer policy, fills the pod and Service
        caches and keeps them current, watches the machines, and starts the clock;
        reconciles start once the caches are filled."""
        if self.elector is not None:
            self.spawn(self.elector.run())
        # The admission policy is read first: the bundled trainer's jobs wait for it.
        self.trainer.start(self.settings.trainer_policy)
        self.watches.start()
        self.machines.start(self.api, self.spawn)
        self.spawn(self.queue.clock(self.settings.resync_s))

    def _machine_changed(self, key: Key) -> None:
        """A Node changed (its readiness, its heartbeat, what may be placed on it), or one
        joined: reconcile the jobs with pods on it, and those whose node pods share a
        machine (one may move there: :mod:`~ddp_operator.planner.placement`)."""
        for job, pods in list(self.pods.by_job.items()):
            seen = pods.values()
            if any(v.machine == key[1] for v in seen) or placement.shares_a_machine(seen):
                self.changed(job)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Runs ``coro`` in the background, keeping a reference until it is done."""
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        error = None if task.cancelled() else task.exception()
        if isinstance(error, kube.NotLeading):
            log.info("stopped: %s", error)  # the Lease lapsed while it ran
        elif error is not None:
            log.error("%s failed", task.get_coro(), exc_info=error)

    def changed(self, key: Key) -> None:
        self.spawn(self.queue.enqueue(key))

    def forget(self, key: Key, uid: str) -> None:
        """Drops what this process remembers of a deleted job."""
        self.actions.forget(uid)
        self.expected.pop(key, None)
        self.queue.later(key, None)
        self.startup.forget(uid)
        self.progress.forget(uid)
        self.trainer.forget(uid)


def _controller(obj: Any) -> str:
    return controller_uid(obj["metadata"])
