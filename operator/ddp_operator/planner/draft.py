"""The plan of one reconcile as it is drafted: what to create and delete, the Events, and the
status patch. Policies only read the :class:`Draft`; :meth:`Draft.apply` applies the
:class:`~.decision.Decision` each returns, and closes the plan with the decision's outcome."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ddp_api.contract import rfc3339
from ddp_api.ddpjob import MAX_HANDLED, DDPJob, DDPJobPhase, EventType
from ddp_api.pods import PodPhase, selector
from ddp_api.status import StatusFields

from .. import incidents, render, reports
from .conditions import job_conditions
from .decision import Decision, EventNote
from .views import PodView, seen_running

HANDLED_KEPT = 64


def kept_handled(handled: list[str], present: set[str]) -> list[str]:
    """The handled uids the status keeps, in order: every one whose pod is still seen (a pod
    being deleted that would otherwise count again: a suspended job of many pods resumed
    before they are gone), and the newest :data:`HANDLED_KEPT` of the others."""
    gone = set([uid for uid in handled if uid not in present][-HANDLED_KEPT:])
    return [uid for uid in handled if uid in present or uid in gone][-MAX_HANDLED:]


@dataclass
class Plan:
    """What to do: objects to create (unless present), pods to delete, the status to write."""

    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)  # pod names
    force: list[str] = field(default_factory=list)  # pod names to delete with grace period 0
    status: StatusFields = field(default_factory=lambda: StatusFields())  # merge patch
    events: list[EventNote] = field(default_factory=list)  # (type, reason, text)
    delete_job: bool = False
    requeue_after: float | None = None
    closed: list[dict[str, Any]] = field(default_factory=list)  # incidents a report closed
    adopt: list[str] = field(default_factory=list)  # orphaned Services to own (names)

    def warn(self, reason: str, text: str) -> None:
        self.events.append((EventType.WARNING, reason, text))

    def requeue(self, seconds: float) -> None:
        seconds = max(seconds, 0.1)
        self.requeue_after = (
            seconds if self.requeue_after is None else min(self.requeue_after, seconds)
        )

    def created_pods(self) -> list[str]:
        return pod_names(self.create)


def pod_names(objects: Iterable[Mapping[str, Any]]) -> list[str]:
    """The names of the pods among ``objects`` (rendered objects to create)."""
    return [o["metadata"]["name"] for o in objects if o["kind"] == "Pod"]


# Phases in which no step is trained: a job there has no time left to show (kubectl get's ETA).
IDLE = frozenset({DDPJobPhase.SUSPENDED, DDPJobPhase.FAILED, DDPJobPhase.QUEUED})


@dataclass
class Draft:
    """The observation one :func:`ddp_operator.planner.plan.plan` call decides on, and its
    plan so far."""

    job: DDPJob
    status: StatusFields
    pods: list[PodView]
    now: dt.datetime
    pending: set[str] = field(default_factory=set)
    plan: Plan = field(default_factory=Plan)
    new: StatusFields = field(default_factory=lambda: StatusFields())
    handled: list[str] = field(default_factory=list)
    restarts: int = 0
    admitted: dict[str, Any] | None = None  # the Admitted condition, for a job Kueue queues
    cause: tuple[str, str] | None = None  # (reason, message) of a failure counted now
    # Pods with the job's name label that it does not control (views.split_by_owner): their
    # names are taken until they are gone.
    foreign: list[PodView] = field(default_factory=list)

    @classmethod
    def observe(
        cls,
        job: DDPJob,
        status: StatusFields,
        pods: Iterable[PodView],
        now: dt.datetime,
        pending: Iterable[str],
        foreign: Iterable[PodView] = (),
    ) -> Draft:
        """The draft before any policy: what the status counted, and the fields every status
        patch writes."""
        generation = job.metadata.get("generation")
        new = StatusFields(observedGeneration=generation, selector=selector(render.job_key(job)[1]))
        handled = list(status.get("handledFailures") or [])
        restarts = int(status.get("restarts") or 0)
        return cls(
            job,
            status,
            list(pods),
            now,
            set(pending),
            new=new,
            handled=handled,
            restarts=restarts,
            foreign=list(foreign),
        )

    @property
    def name(self) -> str:
        return render.job_key(self.job)[1]

    @property
    def workers(self) -> list[PodView]:
        return sorted((x for x in self.pods if x.role == render.ROLE_WORKER), key=lambda x: x.index)

    @property
    def live(self) -> list[PodView]:
        return [x for x in self.pods if not x.deleting]

    @property
    def running(self) -> list[PodView]:
        """The node pods that have not ended and are not being deleted."""
        return [x for x in self.workers if not x.deleting and not x.done]

    @property
    def progress(self) -> Mapping[str, Any] | None:
        """rank 0's newest report: the one written now, else the one shown."""
        return self.new.get("progress") or self.status.get("progress")

    def trained(self) -> bool:
        """Whether rank 0 reported the last step (status.progress.step at totalSteps)."""
        p = self.progress or {}
        step, total = p.get("step"), p.get("totalSteps")
        return step is not None and total is not None and step >= total

    def _delete(self, pods: Iterable[PodView]) -> None:
        """Our own deletions: recorded as handled so they never count as failures."""
        for x in pods:
            if x.name not in self.plan.delete:
                self.plan.delete.append(x.name)
            if x.uid not in self.handled:
                self.handled.append(x.uid)

    @property
    def disruptions(self) -> int:
        """The disruptions counted so far (the status's, and this plan's)."""
        return int(self.new.get("disruptions") or self.status.get("disruptions") or 0)

    def apply(self, d: Decision) -> Plan | None:
        """Applies a policy's decision to the plan; the plan with its status when the decision
        has an outcome (the job ends with :meth:`_finish`), else None."""
        self.plan.create.extend(d.create)
        self.handled.extend(uid for uid in d.handled if uid not in self.handled)
        self._delete(d.delete)
        self.plan.delete = [name for name in self.plan.delete if name not in d.keep]
        self.plan.force.extend(d.force)
        for kind in d.incidents:
            self.new["incidents"] = incidents.open_incident(
                self.status, self.new, kind, rfc3339(self.now)
            )
        if d.disruptions:
            self.new["disruptions"] = self.disruptions + d.disruptions
            self.new["lastDisruptionTime"] = rfc3339(self.now)
        if d.failures:  # their incidents are in d.incidents
            self.restarts += d.failures
            self.new["lastFailureTime"] = rfc3339(self.now)
        self.new.update(d.status)
        if d.admitted is not None:
            self.admitted = dict(d.admitted)
        if d.cause is not None:
            self.cause = d.cause
        self.plan.events.extend(d.events)
        self.plan.closed.extend(d.closed)
        if d.requeue_after is not None:
            self.plan.requeue(d.requeue_after)
        self.plan.delete_job = self.plan.delete_job or d.delete_job
        out = d.outcome
        if out is None:
            return None
        if out.ends and out.phase is not None:
            return self._finish(out.phase, out.reason, out.message)
        return self._result(out.phase, out.reason, out.message)

    def conclude(self, d: Decision) -> Plan:
        """Applies a decision that has an outcome: the plan with its status."""
        out = self.apply(d)
        assert out is not None, "a concluding decision has an outcome"
        return out

    def _finish(self, phase: DDPJobPhase, reason: str, message: str) -> Plan:
        """Ends the job: stops what still runs (finished worker pods stay, for their logs)."""
        self._delete(x for x in self.live if not x.done or x.role != render.ROLE_WORKER)
        self.new["completionTime"] = rfc3339(self.now)
        kind = EventType.NORMAL if phase == DDPJobPhase.SUCCEEDED else EventType.WARNING
        self.plan.events.append((kind, reason, message))
        return self._result(phase, reason, message)

    def _result(self, phase: str | None, reason: str = "", message: str = "") -> Plan:
        """The plan with its status: ``phase`` None keeps the previous phase and conditions."""
        new, desired = self.new, self.job.spec.nodes
        if phase is not None:
            new["phase"], new["reason"] = phase, reason
            previous = self.status.get("conditions") or []
            now = rfc3339(self.now)
            new["conditions"] = job_conditions(previous, self.admitted, phase, reason, message, now)
        alive = self.running
        ready = [x for x in alive if x.ready]
        new["nodes"] = len(alive)
        new["readyNodes"] = len(ready)
        new["ready"] = f"{len(ready)}/{desired}"
        new["restarts"] = self.restarts
        new["handledFailures"] = kept_handled(self.handled, {x.uid for x in self.pods})
        new["seenRunning"] = seen_running(self.pods)
        progress = self.progress or {}
        world = progress.get("worldSize")
        if world:
            new["worldSize"] = world
        if (phase or self.status.get("phase")) in IDLE and progress.get(reports.ETA) is not None:
            # no time left while nothing trains
            new["progress"] = {**progress, reports.ETA: None, reports.ETA_TEXT: None}
        # The image the job's pods ran (a pod past Pending started its containers): kept when
        # no pod is left (readers of the volume run it), and given to the pods it replaces
        # (converge.job_config). One that never ran (a name no machine can pull) is not kept.
        image = next((x.image for x in self.workers if x.image and x.phase != PodPhase.PENDING), "")
        if image:
            new["image"] = image
        self.plan.status = new
        return self.plan
