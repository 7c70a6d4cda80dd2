"""The job's conditions: one per phase it has been in, only the current one True, and Kueue's
``Admitted`` beside them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ddp_api.ddpjob import ConditionStatus, Reason
from ddp_api.metav1 import transition_time
from ddp_api.status import StatusFields

ADMITTED = Reason.ADMITTED  # the condition of a job queued by Kueue


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


def condition(status: StatusFields, ctype: str) -> Mapping[str, Any]:
    """The status's condition of type ``ctype`` ({} when it has none)."""
    return next((c for c in status.get("conditions") or [] if c.get("type") == ctype), {})


def job_conditions(
    previous: Sequence[Mapping[str, Any]],
    admitted: Mapping[str, Any] | None,
    phase: str,
    reason: str,
    message: str,
    now: str,
) -> list[dict[str, Any]]:
    """:func:`conditions`, and the ``admitted`` condition of a job Kueue queues (None: none)."""
    if admitted is None:
        return conditions(previous, phase, reason, message, now)
    # Admitted sits beside the one-per-phase conditions
    kept = [c for c in previous if c.get("type") != ADMITTED]
    out = conditions(kept, phase, reason, message, now)
    old: Mapping[str, Any] = next((c for c in previous if c.get("type") == ADMITTED), {})
    cond = {**old, **admitted}
    cond["lastTransitionTime"] = transition_time(old, cond["status"], now)
    out.append(cond)
    return out
