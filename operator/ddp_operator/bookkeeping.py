"""The controller's bookkeeping, pure (beside :mod:`ddp_operator.planner`, which decides what a job
needs): which status to believe, when to write it, which creates are still pending, how an
unreadable spec ends, the Events it posts and which start-up milestones it times.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from ddp_api.contract import rfc3339
from ddp_api.ddpjob import TERMINAL_PHASES, DDPJobPhase, Reason
from ddp_api.status import StatusFields, status_fields
from ddp_api.trainer_config import validation_message

from .planner.conditions import conditions
from .planner.draft import Plan

EXPECTATION_TTL_S = 30.0
# Status fields that change with every pod coming up; written at most this often.
COUNT_FIELDS = frozenset({"nodes", "readyNodes", "ready", "worldSize", "seenRunning"})
STATUS_COUNTS_EVERY_S = 1.0


def merged(observed: Mapping[str, Any] | None, ours: StatusFields | None) -> StatusFields:
    """The watched status with our own last write on top (a merge patch: None removes), so a
    reconcile never plans from a status staler than the one this process wrote."""
    out = dict(observed or {})
    for k, v in (ours or {}).items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return status_fields(out)


def pending_creates(
    expected: Mapping[str, float], observed: Collection[str], now: float
) -> dict[str, float]:
    """The pods created but not yet seen by the watch (name -> when created); an expectation
    ends when the pod is seen or after EXPECTATION_TTL_S (its create may have been lost)."""
    return {
        name: at
        for name, at in expected.items()
        if name not in observed and now - at <= EXPECTATION_TTL_S
    }


def status_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> set[str]:
    """The status fields that ``new`` changes, an absent field and an empty list being the same.

    A new job's first status has ``handledFailures: []``: that counts no failure, so it must not
    make :func:`status_write` write before the pods (a round trip before every new job's pods).
    """
    return {k for k, v in new.items() if old.get(k) != v and not (v == [] and old.get(k) is None)}


def status_write(
    diff: Collection[str], since_last_write_s: float
) -> tuple[bool, bool, float | None]:
    """(write now, write before acting, requeue after) for the status fields that changed.

    A counted failure (``handledFailures`` changed) is written before the pods are touched, so
    that an operator that dies in between never counts it twice; anything else after acting, so
    that a new job's pods are not held up by a round trip. Changes of pod counts alone are
    written at most once per STATUS_COUNTS_EVERY_S.
    """
    if not diff:
        return False, False, None
    if set(diff) <= COUNT_FIELDS and since_last_write_s < STATUS_COUNTS_EVERY_S:
        return False, False, STATUS_COUNTS_EVERY_S - since_last_write_s
    return True, "handledFailures" in diff, None


def invalid_spec(status: StatusFields, error: ValidationError, now: dt.datetime) -> Plan:
    """A spec the API server accepted but this operator cannot read (say, from a newer CRD)."""
    p = Plan()
    text = validation_message(error, tidy=False)
    if status.get("phase") != DDPJobPhase.FAILED:
        stamp = rfc3339(now)
        p.status = {
            "phase": DDPJobPhase.FAILED,
            "reason": Reason.INVALID_SPEC,
            "completionTime": stamp,
            "conditions": conditions(
                status.get("conditions") or [],
                DDPJobPhase.FAILED,
                Reason.INVALID_SPEC,
                text,
                stamp,
            ),
        }
        p.warn(Reason.INVALID_SPEC, text)
    return p


def newly_handled(status: StatusFields, new: StatusFields) -> list[str]:
    """The pod uids that ``new`` counts for the first time (``handledFailures``), sorted."""
    before = set(status.get("handledFailures") or [])
    return sorted(set(new.get("handledFailures") or []) - before)


def counted_event_names(
    job: Mapping[str, Any], counted: Sequence[str], reasons: Sequence[str]
) -> list[str]:
    """Names for the Events of a reconcile that counts the failures of the pods ``counted``
    (uids), one a reason in ``reasons`` (in order), the same in whichever replica plans them:
    derived from the job's uid, those pods and the reason's place among its like. A leader lost
    after posting them but before its status write is followed by one that counts the same
    failures again and posts the same names: the API server answers AlreadyExists, and each
    failure is told once."""
    seen: dict[str, int] = {}
    names = []
    for reason in reasons:
        nth = seen[reason] = seen.get(reason, -1) + 1
        key = "\n".join([str(job.get("uid") or ""), *counted, reason, str(nth)])
        names.append(f"{job['name']}.{hashlib.sha256(key.encode()).hexdigest()[:16]}")
    return names


def event_body(
    job: Mapping[str, Any], etype: str, reason: str, text: str, *, name: str, now: dt.datetime,
    component: str, instance: str, api_version: str, kind: str,
) -> dict[str, Any]:  # fmt: skip
    """A core/v1 Event about ``job`` (its metadata) as the operator posts it."""
    stamp = now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": job["namespace"]},
        "involvedObject": {
            "apiVersion": api_version,
            "kind": kind,
            "name": job["name"],
            "namespace": job["namespace"],
            "uid": job.get("uid"),
        },
        "type": etype,
        "reason": reason,
        "message": text[:1024],
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": instance,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


# -- metrics: which start-up milestones of a job this process can time ---------------------------
PODS_CREATED = "pods"  # all first node pods created
FIRST_STEP = "step"  # the first training step seen in status.progress


def milestones_to_time(status: StatusFields, workers: int) -> set[str]:
    """The milestones to time for a job seen for the first time: only those still ahead of it,
    so an operator restarted mid-run never records a job's age as a start-up latency."""
    phase = status.get("phase") or ""
    if phase in (*TERMINAL_PHASES, DDPJobPhase.SUSPENDED) or status.get("restarts"):
        return set()
    ahead = set()
    if workers == 0:
        ahead.add(PODS_CREATED)
    if not (status.get("progress") or {}).get("step"):
        ahead.add(FIRST_STEP)
    return ahead


def milestones_reached(
    ahead: Collection[str], status: StatusFields, workers: int, nodes: int
) -> set[str]:
    """Of the milestones still ``ahead`` of a job, those it has reached now."""
    reached = set()
    if PODS_CREATED in ahead and workers >= nodes:
        reached.add(PODS_CREATED)
    if FIRST_STEP in ahead and (status.get("progress") or {}).get("step"):
        reached.add(FIRST_STEP)
    return reached
