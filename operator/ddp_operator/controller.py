"""The controller: a work queue of jobs, expectations of pods created but not yet watched, and
the I/O of each reconcile (create, delete, write status, post Events). The decisions are pure:
:mod:`ddp_operator.plan` (what a job needs) and :mod:`ddp_operator.bookkeeping` (what the
controller believes and writes when); :mod:`ddp_operator.handlers` wires this into kopf. Its
parts of their own: :mod:`~ddp_operator.actions` (carrying out a plan),
:mod:`~ddp_operator.machines` (Nodes and their heartbeats), :mod:`~ddp_operator.workloads`
(Kueue Workloads), :mod:`~ddp_operator.trainer_objects` (each job's progress ConfigMap and
account).

Events about a job are coalesced as in Kubernetes' own controllers' work queues: at most one
reconcile of a job runs at a time, and events that arrive meanwhile cause one more, on the
newest state. Idempotence: pod and Service names are deterministic, so a create that repeats
(after a restart) meets AlreadyExists and changes nothing; creates made but not yet seen by the
watch are remembered ("expectations"), and the status this process wrote last is preferred
over a staler one from the watch.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import kopf
from pydantic import ValidationError

from ddp_api import contract
from ddp_api.contract import parse_rfc3339
from ddp_api.ddpjob import DDPJob

from . import bookkeeping, informer, kube, queueing, render, reports
from . import plan as planner
from .actions import Actions
from .machines import Machines
from .metrics import OperatorMetrics
from .settings import Settings
from .trainer_objects import TrainerObjects
from .workloads import Workloads

log = logging.getLogger("ddp_operator")

Key = tuple[str, str]


@dataclass
class Controller:
    """The operator's memory between events; lost on restart, which only costs API calls."""

    settings: Settings = field(default_factory=Settings)
    active: set[Key] = field(default_factory=set)  # jobs being reconciled now
    again: set[Key] = field(default_factory=set)  # ... that had events meanwhile
    # Pods created but not yet seen by the watch: name -> when created.
    expected: dict[Key, dict[str, float]] = field(default_factory=dict)
    due: dict[Key, float] = field(default_factory=dict)  # monotonic time of the next check
    rejected: dict[str, str] = field(default_factory=dict)  # job uid -> last progress refused
    api: kube.Kube | None = None
    jobs: kopf.Index[Any, Any] | None = None  # kopf's jobs_by_name index
    pods: informer.Cache[planner.PodView] = field(
        default_factory=lambda: informer.Cache(render.LABEL_JOB, planner.view)
    )
    services: informer.Cache[str] = field(
        default_factory=lambda: informer.Cache(render.LABEL_JOB, _name)
    )
    progress: informer.Cache[reports.Record] = field(
        default_factory=lambda: informer.Cache(render.LABEL_JOB, reports.record_of, reports.job_of)
    )
    workloads: Workloads = field(default_factory=Workloads)  # queued jobs' Kueue Workloads
    watches: informer.Watches | None = None
    trainer: TrainerObjects = field(init=False)  # each job's progress ConfigMap and account
    actions: Actions = field(init=False)  # carries out each plan
    machines: Machines | None = None  # Nodes and their heartbeats, once the watches start
    waiting: set[Key] = field(default_factory=set)  # jobs seen before their caches were filled
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    # Job uid -> start-up milestones still to time (bookkeeping.milestones_to_time).
    ahead: dict[str, set[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.trainer = TrainerObjects(self.pods)
        self.actions = Actions(self.metrics, self.trainer)

    def start_watches(self, api: kube.Kube) -> None:
        """Fills the pod and Service caches, then keeps them current; reconciles start after."""
        self.api = self.workloads.api = self.trainer.api = self.actions.api = api
        caches: dict[str, informer.Cache[Any]] = {
            "pods": self.pods,
            "services": self.services,
            "configmaps": self.progress,
        }
        if self.settings.kueue:
            caches[queueing.WORKLOADS] = self.workloads.cache
        self.watches = informer.Watches(
            api,
            caches,
            self.changed,
            self._release,
            api_versions={queueing.WORKLOADS: queueing.KUEUE_API},
        )
        self.watches.start()
        self.machines = Machines(self.settings.node_lost_grace_s, self._machine_changed)
        self.machines.start(api, self.spawn)

    def _machine_changed(self, key: Key) -> None:
        """A Node's readiness changed: reconcile the jobs with pods on it."""
        for job, pods in list(self.pods.by_job.items()):
            if any(v.machine == key[1] for v in pods.values()):
                self.changed(job)

    def spawn(self, coro: Any) -> None:
        """Runs ``coro`` in the background, keeping a reference until it is done."""
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def changed(self, key: Key) -> None:
        self.spawn(self.enqueue(key))

    def _release(self, namespace: str | None) -> None:
        """The caches of ``namespace`` (None: all) are filled: reconcile the jobs that waited."""
        for key in sorted(self.waiting):
            if namespace is None or key[0] == namespace:
                self.waiting.discard(key)
                self.spawn(self.enqueue(key))

    def forget(self, key: Key, uid: str) -> None:
        """Drops what this process remembers of a deleted job."""
        self.actions.forget(uid)
        self.expected.pop(key, None)
        self.due.pop(key, None)
        self.ahead.pop(uid, None)
        self.rejected.pop(uid, None)
        self.trainer.forget(uid)

    def queue_depth(self) -> int:
        """Jobs being reconciled, due for one, or waiting for the caches (a metric)."""
        now = time.monotonic()
        due = {k for k, t in self.due.items() if t <= now}
        return len(self.active | self.again | self.waiting | due)

    # -- the work queue --------------------------------------------------------------------------
    async def enqueue(self, key: Key) -> None:
        """Reconciles ``key`` now, or once more after the reconcile that is running."""
        if self.watches is None or not self.watches.ready(key[0]):
            self.waiting.add(key)  # planning from empty caches would recreate what exists
            return
        if key in self.active:
            self.again.add(key)
            return
        self.active.add(key)
        try:
            while True:
                self.again.discard(key)
                bodies = list(self.jobs.get(key, [])) if self.jobs is not None else []
                if not bodies:
                    break
                started = time.perf_counter()
                try:
                    await self.reconcile(bodies[0])
                except Exception:
                    log.exception("reconcile of %s/%s failed; retrying in 5s", *key)
                    self.due[key] = time.monotonic() + 5
                self.metrics.reconcile.observe(time.perf_counter() - started)
                if key not in self.again:
                    break
        finally:
            self.active.discard(key)

    async def reconcile(self, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        key: Key = (meta["namespace"], meta["name"])
        observed = self.pods.get(key)
        pods = {v.name for v in observed}  # a Service may have a pod's name (<job>-rdzv)
        services = self.services.names(key)
        expected = bookkeeping.pending_creates(self.expected.get(key, {}), pods, time.monotonic())
        self.expected[key] = expected
        status = bookkeeping.merged(
            body.get("status") or {}, self.actions.written.get(meta.get("uid", ""))
        )
        job: DDPJob | None = None
        workload: dict[str, Any] | None = None
        admission: queueing.Admission | None = None
        try:
            job = DDPJob.model_validate({"metadata": meta, "spec": body.get("spec") or {}})
        except ValidationError as e:
            p = bookkeeping.invalid_spec(status, e, dt.datetime.now(dt.UTC))
        else:
            queue = queueing.queue_name(meta) if self.settings.kueue else ""
            if queue:
                workload = self.workloads.of(key, job)
                worker = render.render_worker(job, 0, 0, self.settings.render)
                admission = await self.workloads.admission(job, worker, queue, workload, status)
            progress, refused = self._progress(key, meta.get("uid", ""))
            p = planner.plan(
                job,
                status,
                observed,
                dt.datetime.now(dt.UTC),
                self.settings.render,
                self.settings.backoff_base_s,
                pending=expected.keys(),
                admission=admission,
                progress=progress,
                completion_grace_s=self.settings.completion_grace_s,
                machines=self.machines.views() if self.machines is not None else {},
                node_lost_grace_s=self.settings.node_lost_grace_s,
            )
            if refused:
                p.warn("ProgressRejected", refused)
        p.create = [
            o
            for o in p.create
            if o["metadata"]["name"] not in (services if o["kind"] == "Service" else pods)
        ]
        store = render.store_name(meta["name"])
        workers_before = {v.name for v in observed if v.role == render.ROLE_WORKER}
        workers_before |= {n for n in expected if n != store}
        made = await self.actions.run(body, job, status, p)
        for obj in made:
            if obj["kind"] == "Pod":
                expected[obj["metadata"]["name"]] = time.monotonic()
        if job is not None:
            made_workers = {o["metadata"]["name"] for o in made if _is_worker(o)}
            self._time_startup(meta, status, workers_before, made_workers, job.spec.nodes)
        if workload is not None:
            await self.workloads.sync(workload, observed, {**status, **p.status})
        if len(made) < len(p.create):
            p.requeue(5.0)  # some creates were refused: try again soon, events or not
        self.trainer.retire_legacy_soon(meta["namespace"], self.spawn)
        if p.requeue_after is not None:
            self.due[key] = time.monotonic() + p.requeue_after
        else:
            self.due.pop(key, None)

    def _time_startup(
        self,
        meta: dict[str, Any],
        status: dict[str, Any],
        before: set[str],
        made: set[str],
        nodes: int,
    ) -> None:
        """Observes the start-up histograms once per job, for milestones this process saw."""
        uid = meta.get("uid", "")
        if uid not in self.ahead:
            self.ahead[uid] = bookkeeping.milestones_to_time(status, len(before))
        ahead = self.ahead[uid]
        if not ahead:
            return
        reached = bookkeeping.milestones_reached(ahead, status, len(before | made), nodes)
        created = parse_rfc3339(meta.get("creationTimestamp"))
        if not reached or created is None:
            return
        age = max(0.0, (dt.datetime.now(dt.UTC) - created).total_seconds())
        if bookkeeping.PODS_CREATED in reached:
            self.metrics.job_pods_created.observe(age)
        if bookkeeping.FIRST_STEP in reached:
            self.metrics.job_first_step.observe(age)
        ahead -= reached

    def _progress(self, key: Key, uid: str) -> tuple[dict[str, Any] | None, str]:
        """Rank 0's newest valid progress record of the job (None: none yet, or refused), and
        why it was refused when that is news (an Event once per refused record)."""
        record = next(iter(self.progress.get(key)), None)
        if record is None or record.owner != uid:  # none, or a namesake's not yet collected
            return None, ""
        try:
            progress = reports.parse(record)
        except reports.Rejected as e:
            if record.text is None and not record.chars:
                return None, ""  # the empty ConfigMap the operator made: nothing reported yet
            seen = record.text or str(record.chars)
            if self.rejected.get(uid) == seen:
                return None, ""
            self.rejected[uid] = seen
            name = contract.progress_configmap(key[1])
            why = f"ignored the progress in ConfigMap {name}: {e}"
            return None, f"{why}; status.progress keeps the last valid report"
        self.rejected.pop(uid, None)
        return progress, ""

    # -- the clock: backoff, deadline and TTL end by time, not by an event ----------------------
    async def clock(self) -> None:
        last_resync = time.monotonic()
        while True:
            await asyncio.sleep(0.5)
            now = time.monotonic()
            if now - last_resync >= self.settings.resync_s:
                last_resync = now
                keys = list(self.jobs or [])
            else:
                keys = [k for k, t in self.due.items() if t <= now]
            for key in keys:
                self.due.pop(key, None)
                self.spawn(self.enqueue(key))


def _is_worker(obj: dict[str, Any]) -> bool:
    labels = obj["metadata"].get("labels") or {}
    return obj["kind"] == "Pod" and labels.get(render.LABEL_ROLE) == render.ROLE_WORKER


def _name(obj: Any) -> str:
    return str(obj["metadata"]["name"])
