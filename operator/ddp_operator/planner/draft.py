"""The plan of one reconcile as it is drafted: what to create and delete, the Events, and the
status patch, which each policy adds to, either directly or by returning a :class:`Decision`
that :meth:`Draft.apply` applies; :meth:`Draft.result` closes it."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ddp_api.contract import rfc3339
from ddp_api.ddpjob import ConditionStatus, DDPJob, DDPJobPhase, IncidentKind, Reason
from ddp_api.metav1 import transition_time

from .. import incidents, render
from .views import PodView

HANDLED_KEPT = 64
ADMITTED = Reason.ADMITTED  # the condition of a job queued by Kueue


@dataclass
class Plan:
    """What to do: objects to create (unless present), pods to delete, the status to write."""

    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)  # pod names
    force: list[str] = field(default_factory=list)  # pod names to delete with grace period 0
    status: dict[str, Any] = field(default_factory=dict)  # merge patch of .status
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, text)
    delete_job: bool = False
    requeue_after: float | None = None
    closed: list[dict[str, Any]] = field(default_factory=list)  # incidents a report closed

    def warn(self, reason: str, text: str) -> None:
        self.events.append(("Warning", reason, text))

    def info(self, reason: str, text: str) -> None:
        self.events.append(("Normal", reason, text))

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


@dataclass(frozen=True)
class Outcome:
    """The phase a policy decided the job is in, which ends the planning of this reconcile."""

    phase: DDPJobPhase | None  # None: the phase and conditions stay as they are
    reason: str
    message: str
    ends: bool = False  # the job ends (:meth:`Draft.finish`): what still runs is stopped


@dataclass(frozen=True)
class Decision:
    """What one policy decided, from a draft it only reads: the orchestrator applies it
    (:meth:`Draft.apply`) before it asks the next policy, and ends with its ``outcome`` if it
    has one."""

    create: tuple[dict[str, Any], ...] = ()  # objects to create (unless present)
    handled: tuple[str, ...] = ()  # pod uids counted (or known gone) now
    delete: tuple[PodView, ...] = ()  # our own deletions (:meth:`Draft.delete`)
    force: tuple[str, ...] = ()  # pod names to delete with grace period 0
    incidents: tuple[IncidentKind, ...] = ()  # opened, in this order
    disruptions: int = 0  # counted now: status.disruptions, lastDisruptionTime
    failures: int = 0  # restarts counted now against backoffLimit: lastFailureTime
    status: Mapping[str, Any] = field(default_factory=dict)  # other fields of the status patch
    events: tuple[tuple[str, str, str], ...] = ()  # (type, reason, text)
    requeue_after: float | None = None
    delete_job: bool = False  # the DDPJob itself (its TTL is due)
    admitted: Mapping[str, Any] | None = None  # Kueue's Admitted condition (:attr:`Draft.admitted`)
    cause: tuple[str, str] | None = None  # (reason, message) of a failure counted now
    closed: tuple[dict[str, Any], ...] = ()  # incidents a new report closed (Plan.closed)
    outcome: Outcome | None = None


NOTHING = Decision()  # a policy's, when it has nothing to do


def conditions(
    previous: Iterable[Mapping[str, Any]], phase: str, reason: str, message: str, now: str
) -> list[dict[str, Any]]:
    """One condition per phase the job has been in; only the current one is True
    (``lastTransitionTime``: :func:`ddp_api.metav1.transition_time`)."""
    by_type = {c["type"]: dict(c) for c in previous}
    by_type.setdefault(phase, {"type": phase, "status": ConditionStatus.FALSE})
    out = []
    for ctype, c in by_type.items():
        status = ConditionStatus.TRUE if ctype == phase else ConditionStatus.FALSE
        c["lastTransitionTime"] = transition_time(c, status, now)
        c["status"] = status
        if ctype == phase:
            c["reason"], c["message"] = reason, message
        out.append(c)
    return out


def condition(status: Mapping[str, Any], ctype: str) -> Mapping[str, Any]:
    """The status's condition of type ``ctype`` ({} when it has none)."""
    return next((c for c in status.get("conditions") or [] if c.get("type") == ctype), {})


@dataclass
class Draft:
    """The observation one :func:`ddp_operator.planner.plan.plan` call decides on, and its
    plan so far."""

    job: DDPJob
    status: Mapping[str, Any]
    pods: list[PodView]
    now: dt.datetime
    pending: set[str] = field(default_factory=set)
    plan: Plan = field(default_factory=Plan)
    new: dict[str, Any] = field(default_factory=dict)
    handled: list[str] = field(default_factory=list)
    restarts: int = 0
    admitted: dict[str, Any] | None = None  # the Admitted condition, for a job Kueue queues
    cause: tuple[str, str] | None = None  # (reason, message) of a failure counted now

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
    def progress(self) -> Mapping[str, Any] | None:
        """rank 0's newest report: the one written now, else the one shown."""
        return self.new.get("progress") or self.status.get("progress")

    def trained(self) -> bool:
        """Whether rank 0 reported the last step (status.progress.step at totalSteps)."""
        p = self.progress or {}
        step, total = p.get("step"), p.get("totalSteps")
        return step is not None and total is not None and step >= total

    def delete(self, pods: Iterable[PodView]) -> None:
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
        has an outcome (the job ends with :meth:`finish`), else None."""
        self.plan.create.extend(d.create)
        self.handled.extend(uid for uid in d.handled if uid not in self.handled)
        self.delete(d.delete)
        self.plan.force.extend(d.force)
        for kind in d.incidents:
            self.incident(kind)
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
            return self.finish(out.phase, out.reason, out.message)
        return self.result(out.phase, out.reason, out.message)

    def conclude(self, d: Decision) -> Plan:
        """Applies a decision that has an outcome: the plan with its status."""
        out = self.apply(d)
        assert out is not None, "a concluding decision has an outcome"
        return out

    def incident(self, kind: IncidentKind) -> None:
        """Opens an incident of ``kind`` (:mod:`ddp_operator.incidents`)."""
        self.new["incidents"] = incidents.open_incident(
            self.status, self.new, kind, rfc3339(self.now)
        )

    def count_disruption(self, kind: IncidentKind = IncidentKind.DISRUPTION) -> int:
        """One more disruption in the status, and its incident; returns how many there have
        been."""
        self.incident(kind)
        n = self.disruptions + 1
        self.new["disruptions"] = n
        self.new["lastDisruptionTime"] = rfc3339(self.now)
        return n

    def count_failure(self, kind: IncidentKind = IncidentKind.FAILURE) -> bool:
        """One more restart against backoffLimit, counted now, and its incident; whether the
        job has used up its backoffLimit."""
        self.incident(kind)
        self.restarts += 1
        self.new["lastFailureTime"] = rfc3339(self.now)
        return self.restarts > self.job.spec.backoff_limit

    def finish(self, phase: DDPJobPhase, reason: str, message: str) -> Plan:
        """Ends the job: stops what still runs (finished worker pods stay, for their logs)."""
        self.delete(x for x in self.live if not x.done or x.role != render.ROLE_WORKER)
        self.new["completionTime"] = rfc3339(self.now)
        (self.plan.info if phase == DDPJobPhase.SUCCEEDED else self.plan.warn)(reason, message)
        return self.result(phase, reason, message)

    def result(self, phase: str | None, reason: str = "", message: str = "") -> Plan:
        """The plan with its status: ``phase`` None keeps the previous phase and conditions."""
        new, desired = self.new, self.job.spec.nodes
        if phase is not None:
            new["phase"], new["reason"] = phase, reason
            new["conditions"] = self._conditions(phase, reason, message)
        alive = [x for x in self.workers if not x.deleting and not x.done]
        ready = [x for x in alive if x.ready]
        new["nodes"] = len(alive)
        new["readyNodes"] = len(ready)
        new["ready"] = f"{len(ready)}/{desired}"
        new["restarts"] = self.restarts
        new["handledFailures"] = self.handled[-HANDLED_KEPT:]
        world = (self.progress or {}).get("worldSize")
        if world:
            new["worldSize"] = world
        self.plan.status = new
        return self.plan

    def _conditions(self, phase: str, reason: str, message: str) -> list[dict[str, Any]]:
        now = rfc3339(self.now)
        previous = self.status.get("conditions") or []
        if self.admitted is None:
            return conditions(previous, phase, reason, message, now)
        # Admitted sits beside the one-per-phase conditions
        kept = [c for c in previous if c.get("type") != ADMITTED]
        out = conditions(kept, phase, reason, message, now)
        old: dict[str, Any] = next((c for c in previous if c.get("type") == ADMITTED), {})
        cond = {**old, **self.admitted}
        cond["lastTransitionTime"] = transition_time(old, cond["status"], now)
        out.append(cond)
        return out
