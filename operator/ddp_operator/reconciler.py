"""One reconcile of one job: what it reads (the caches, the job's status as this process last
wrote it), what it decides (:func:`ddp_operator.planner.plan.plan`, the pure planner) and what
it does (:class:`~ddp_operator.actions.Actions`). The :class:`~ddp_operator.controller.Controller`
builds it from its parts and its work queue calls :meth:`Reconciler.reconcile`, one job at a
time."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import functools
import time
from collections.abc import Callable, Collection, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ddp_api import contract
from ddp_api.ddpjob import DDPJob, DDPJobPhase, Reason
from ddp_api.status import StatusFields

from . import bookkeeping, claims, informer, queueing, render
from .actions import Actions
from .kueue_workloads import KueueWorkloads
from .machines import Machines
from .planner import views
from .planner.draft import Plan
from .planner.plan import PlanSettings, plan
from .progress_records import ProgressRecords
from .settings import Settings
from .startup import StartupTimes
from .trainer_objects import TrainerObjects
from .workqueue import Key


@dataclass
class Reconciler:
    """The parts a reconcile reads and writes: the controller's, shared, not copies."""

    settings: Settings
    expected: dict[Key, dict[str, float]]  # pods created but not yet seen: name -> when
    pods: informer.Cache[views.PodView]
    services: informer.Cache[str]
    progress: ProgressRecords
    actions: Actions
    trainer: TrainerObjects
    workloads: KueueWorkloads
    machines: Machines
    startup: StartupTimes
    spawn: Callable[[Coroutine[Any, Any, None]], None]
    later: Callable[[Key, float | None], None]  # the work queue's: reconcile again after
    jobs: Callable[[], Iterable[Mapping[str, Any]]] = tuple  # every job's index snapshot

    async def reconcile(self, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        key: Key = (meta["namespace"], meta["name"])
        # An earlier job of this name may have left pods the garbage collector has not deleted
        # yet: they are not this job's, and their names wait (views.split_by_owner).
        observed, foreign = views.split_by_owner(self.pods.get(key), meta.get("uid", ""))
        pods = {v.name for v in observed}  # a Service may have a pod's name (<job>-rdzv)
        expected = bookkeeping.pending_creates(self.expected.get(key, {}), pods, time.monotonic())
        self.expected[key] = expected
        status = bookkeeping.merged(
            body.get("status"), self.actions.written.get(meta.get("uid", ""))
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
            p, workload = await self._plan(
                key, job, status, observed, foreign, expected.keys(), in_pod
            )
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
        self.trainer.legacy.retire_soon(meta["namespace"], self.spawn)
        self.trainer.settle(meta["namespace"], observed)
        self.later(key, p.requeue_after)

    async def _account_first(self, job: DDPJob, status: StatusFields, in_pod: bool) -> None:
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
        status: StatusFields,
        observed: list[views.PodView],
        foreign: list[views.PodView],
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
            worker = functools.partial(render.render_worker, job, 0, 0, cfg)
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
            services=self.services.kept(key),
            foreign=foreign,
        )
        for why in refused:
            p.warn(Reason.PROGRESS_REJECTED, why)
        news = self.trainer.news(job, in_pod)
        if news:
            p.warn(Reason.TRAINER_POLICY_MISSING, news)
        if _first_start(status, p):  # another live job on its checkpoint claim
            claim = claims.job_claim(job.spec)
            others = claims.sharing(key[0], key[1], claim, self.jobs())
            if claim and others:
                p.warn(Reason.CHECKPOINT_CLAIM_SHARED, claims.shared_message(claim, others))
        return p, workload


def _first_start(status: StatusFields, p: Plan) -> bool:
    """The plan creates a job's first node pods: before any restart, while it was new, Pending
    or Queued."""
    first = status.get("phase") in (None, "", DDPJobPhase.PENDING, DDPJobPhase.QUEUED)
    return first and not status.get("restarts") and any(_is_worker(o) for o in p.create)


def _is_worker(obj: dict[str, Any]) -> bool:
    labels = obj["metadata"].get("labels") or {}
    return obj["kind"] == "Pod" and labels.get(render.LABEL_ROLE) == render.ROLE_WORKER
