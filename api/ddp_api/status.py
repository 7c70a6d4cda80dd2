"""The DDPJob status as the operator reads and writes it: JSON with camelCase keys, one typed
dict (:class:`StatusFields`) whose keys are :class:`~ddp_api.ddpjob.DDPJobStatus`'s aliases
(a unit test keeps them equal), so that a status field the operator spells wrong, or gives a
value of the wrong type, is a type error and not a silent new key.

The same type is the previous status a reconcile reads and the merge patch it writes (a key
set to None removes the field)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict, cast


class StatusFields(TypedDict, total=False):
    """Every field of ``DDPJob.status`` (see DDPJobStatus for what each means)."""

    phase: str | None
    reason: str | None
    conditions: list[dict[str, Any]] | None
    nodes: int | None
    readyNodes: int | None
    ready: str | None
    selector: str | None
    image: str | None
    restarts: int | None
    disruptions: int | None
    worldSize: int | None
    startTime: str | None
    completionTime: str | None
    observedGeneration: int | None
    progress: dict[str, Any] | None
    lastFailureTime: str | None
    lastDisruptionTime: str | None
    incidents: list[dict[str, Any]] | None
    keptSeconds: float | None
    heldSeconds: float | None
    firstReportTime: str | None
    goodput: float | None
    lastStepTime: str | None
    stalledAtStep: int | None
    queue: str | None
    clusterQueue: str | None
    admissions: int | None
    admittedNodes: int | None
    handledFailures: list[str] | None
    seenRunning: dict[str, str] | None


FIELDS = frozenset(StatusFields.__annotations__)


def status_fields(raw: Mapping[str, Any] | None) -> StatusFields:
    """The status as read from the API server, typed: its known fields (a key this version
    does not know, written by another, is left out of what is planned from; a merge patch
    leaves it on the server)."""
    return cast(StatusFields, {k: v for k, v in (raw or {}).items() if k in FIELDS})
