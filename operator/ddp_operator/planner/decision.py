"""What one policy decides: a frozen :class:`Decision`, from a draft it only reads, which
:meth:`.draft.Draft.apply` applies before the next policy is asked."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ddp_api.ddpjob import DDPJobPhase, EventType, IncidentKind
from ddp_api.status import StatusFields

from .views import PodView

EventNote = tuple[EventType, str, str]  # an Event to record about the job: (type, reason, text)


@dataclass(frozen=True)
class Outcome:
    """The phase a policy decided the job is in, which ends the planning of this reconcile."""

    phase: DDPJobPhase | None  # None: the phase and conditions stay as they are
    reason: str
    message: str
    ends: bool = False  # the job ends (:meth:`.draft.Draft.apply`): what still runs is stopped


@dataclass(frozen=True)
class Decision:
    """What one policy decided, from a draft it only reads: the orchestrator applies it
    (:meth:`.draft.Draft.apply`) before it asks the next policy, and ends with its
    ``outcome`` if it has one."""

    create: tuple[dict[str, Any], ...] = ()  # objects to create (unless present)
    handled: tuple[str, ...] = ()  # pod uids counted (or known gone) now
    delete: tuple[PodView, ...] = ()  # our own deletions: recorded as handled too
    force: tuple[str, ...] = ()  # pod names to delete with grace period 0
    # pod names an earlier policy deletes that stay after all (a failed PerStep group waiting
    # out its backoff holds its index, and its logs, until the backoff is over)
    keep: tuple[str, ...] = ()
    incidents: tuple[IncidentKind, ...] = ()  # opened, in this order
    disruptions: int = 0  # counted now: status.disruptions, lastDisruptionTime
    failures: int = 0  # restarts counted now against backoffLimit: lastFailureTime
    # other fields of the status patch
    status: StatusFields = field(default_factory=lambda: StatusFields())
    events: tuple[EventNote, ...] = ()
    requeue_after: float | None = None
    delete_job: bool = False  # the DDPJob itself (its TTL is due)
    admitted: Mapping[str, Any] | None = None  # Kueue's Admitted condition, when it queues
    cause: tuple[str, str] | None = None  # (reason, message) of a failure counted now
    closed: tuple[dict[str, Any], ...] = ()  # incidents a new report closed (Plan.closed)
    outcome: Outcome | None = None


NOTHING = Decision()  # a policy's, when it has nothing to do
