"""The controller: what a reconcile of one job reads, decides and does, and the parts it is
made of. The decisions are pure: :mod:`ddp_operator.planner` (what a job needs) and
:mod:`ddp_operator.bookkeeping` (what the controller believes and writes when);
:mod:`ddp_operator.handlers` wires this into kopf. Its parts, each of one job:
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
import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable, Collection, Coroutine
from dataclasses import dataclass, field
from typing import Any

import kopf
from pydantic import ValidationError

from ddp_api import contract
from ddp_api.ddpjob import DDPJob

from . import bookkeeping, informer, kube, queueing, render
from .actions import COMPONENT, Actions
from .kueue_workloads import KueueWorkloads
from .leadership import Elector
from .machines import Machines
from .metrics import OperatorMetrics
from .planner import views
from .planner.draft import Plan
from .planner.plan import PlanSettings, plan
from .progress_records import ProgressRecords
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
    services: informer.Cache[str] = field(
        default_factory=lambda: informer.Cache(render.LABEL_JOB, _name)
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
        self.queue = WorkQueue(
            self.reconcile,
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
        """A Node's readiness changed: reconcile the jobs with pods on it."""
        for job, pods in list(self.pods.by_job.items()):
            if any(v.machine == key[1] for v in pods.values()):
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

    async def reconcile(self, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        key: Key = (meta["namespace"], meta["name"])
        observed = self.pods.get(key)
        pods = {v.name for v in observed}  # a Service may have a pod's name (<job>-rdzv)
        expected = bookkeeping.pending_creates(self.expected.get(key, {}), pods, time.monotonic())
        self.expected[key] = expected
        status = bookkeeping.merged(
            body.get("status") or {}, self.actions.written.get(meta.get("uid", ""))
        )
        job: DDPJob | None = None
        workload: dict[str, Any] | None = None
        in_pod = True
        try:
            job = DDPJob.model_validate({"metadata": meta, "spec": body.get("spec") or {}})
        except ValidationError as e:
            p = bookkeeping.invalid_spec(status, e, dt.datetime.now(dt.UTC))
        else:
            in_pod = await self.trainer.in_pod(job)
            await self._account_first(job, status, in_pod)
            p, workload = await self._plan(key, job, status, observed, expected.keys(), in_pod)
        services = self.services.names(key)
        p.create = [
            o
            for o in p.create
            if o["metadata"]["name"] not in (services if o["kind"] == "Service" else pods)
        ]
        servers = {render.store_name(meta["name"]), contract.lighthouse_name(meta["name"])}
        workers_before = {v.name for v in observed if v.role == render.ROLE_WORKER}
        workers_before |= {n for n in expected if n not in servers}
        made = await self.actions.run(body, job, status, p, in_pod)
        for obj in made:
            if obj["kind"] == "Pod":
                expected[obj["metadata"]["name"]] = time.monotonic()
        if job is not None:
            made_workers = {o["metadata"]["name"] for o in made if _is_worker(o)}
            self.startup.observe(meta, status, workers_before, made_workers, job.spec.nodes)
        if workload is not None:
            await self.workloads.sync(workload, observed, {**status, **p.status})
        if len(made) < len(p.create):
            p.requeue(5.0)  # some creates were refused: try again soon, events or not
        self.trainer.retire_legacy_soon(meta["namespace"], self.spawn)
        self.trainer.settle(meta["namespace"], observed)
        self.queue.later(key, p.requeue_after)

    async def _account_first(self, job: DDPJob, status: dict[str, Any], in_pod: bool) -> None:
        """A new job's pods will wait for their trainer account: its create goes out before the
        plan is made, so that the round trip runs while the plan is computed (the short sleep
        is a turn of the event loop long enough for the request to be sent; a job whose pods
        need no account of ours, or one made already, does not wait for it)."""
        if status.get("phase") or job.spec.suspend:
            return
        account = self.trainer.account(job, in_pod)
        if account is not None and not account.done():
            await asyncio.sleep(0.001)

    async def _plan(
        self,
        key: Key,
        job: DDPJob,
        status: dict[str, Any],
        observed: list[views.PodView],
        pending: Collection[str],
        in_pod: bool,
    ) -> tuple[Plan, dict[str, Any] | None]:
        """What to do for a valid spec, and the job's Kueue Workload when it is queued;
        ``in_pod``: its new pods report into their own pod (else into the job's ConfigMap)."""
        cfg = self.settings.render
        if cfg.progress_in_pod != in_pod:
            cfg = dataclasses.replace(cfg, progress_in_pod=in_pod)
        workload: dict[str, Any] | None = None
        admission: queueing.Admission | None = None
        queue = queueing.queue_name(job.metadata) if self.settings.kueue else ""
        if queue:
            workload = self.workloads.of(key, job)
            worker = render.render_worker(job, 0, 0, cfg)
            admission = await self.workloads.admission(job, worker, queue, workload, status)
        progress, refused = self.progress.latest(
            key, job.metadata.get("uid", ""), observed, status.get("progress")
        )
        rules = PlanSettings(
            cfg,
            self.settings.backoff_base_s,
            self.settings.completion_grace_s,
            self.settings.node_lost_grace_s,
        )
        p = plan(
            job,
            status,
            observed,
            dt.datetime.now(dt.UTC),
            rules,
            pending=pending,
            admission=admission,
            progress=progress,
            machines=self.machines.views(),
        )
        for why in refused:
            p.warn("ProgressRejected", why)
        news = self.trainer.news(job, in_pod)
        if news:
            p.warn("TrainerPolicyMissing", news)
        return p, workload


def _is_worker(obj: dict[str, Any]) -> bool:
    labels = obj["metadata"].get("labels") or {}
    return obj["kind"] == "Pod" and labels.get(render.LABEL_ROLE) == render.ROLE_WORKER


def _name(obj: Any) -> str:
    return str(obj["metadata"]["name"])
