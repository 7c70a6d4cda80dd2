"""What each incident cost a job: pure bookkeeping of ``status.incidents`` and ``status.goodput``.

An incident is opened when the planner counts something that stops training (in PerStep mode,
something that stops one replica group, or stalls them all briefly): a failure, a disruption, a
lost machine, a stall, the store pod or the lighthouse pod lost, a resize (``KINDS``, of
:class:`ddp_api.ddpjob.IncidentKind`). It holds when it was detected and the step the job had
reported by then. It is closed by the first progress report written after it (``updatedAt``
later than ``detectedAt``): training went on from there, so ``resumedAt`` is that report's
time, ``seconds`` the time between, and ``stepsRedone`` the steps done again (a resume from the
checkpoint of step C reports step C + 1 first: ``atStep + 1 - step``, never below 0; 0 when
the other PerStep groups trained on). Several incidents open at once (a lost machine and its
consequences) close together, as one outage: its redone steps count once, and each shows its
``lostSeconds`` (below). The newest :data:`KEPT` are kept.

``goodput`` is the time in steps that were kept over the wall time since training began (rank
0's first report, ``firstReportTime``), less the time it was paused at a hold point
(``heldSeconds``: from a report with ``heldAtStep`` to the next, as the trainer reports at once
when a hold begins and when it ends). ``keptSeconds`` adds the time between consecutive
reports that moved the step, and loses the redone steps' time (at the pace before the incident)
when an incident closes. Across an incident it adds only the steps' time at the pace before it:
in PerStep mode the other groups train on while a group is lost and their steps are kept, but
their stall (and a slower pace with fewer groups) is the incident's cost; in Restart mode the
new steps a resumed run made before its first report are kept, the restart is not. Where the
report before the incident gave no pace (the first report, or one at a hold point, which has no
``estimatedRemainingSeconds``), none of that time is kept. What goodput so loses is the
closing incidents' ``lostSeconds``: the time between the reports around the outage, less the
steps kept across it, plus the redone steps' time. The
start-up before the first report is no incident's cost and is left out (a 90 s job that spent
30 s starting and 21 s in one incident showed 0.41 when goodput counted from ``startTime``); a
restart's start-up is in its incident's time, so it counts. Both ends are the trainer's clock
(``updatedAt``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ddp_api.contract import parse_rfc3339
from ddp_api.ddpjob import IncidentKind
from ddp_api.status import StatusFields

from . import reports

KEPT = 10
KINDS = tuple(IncidentKind)


def opened(
    incidents: Sequence[Mapping[str, Any]], kind: str, now: str, progress: Mapping[str, Any] | None
) -> list[dict[str, Any]]:
    """``incidents`` with one more, open, detected ``now``."""
    entry: dict[str, Any] = {"kind": kind, "detectedAt": now}
    step = (progress or {}).get("step")
    if step is not None:
        entry["atStep"] = step
    return [*map(dict, incidents), entry][-KEPT:]


def is_open(incident: Mapping[str, Any]) -> bool:
    return "resumedAt" not in incident


def closing(
    incidents: Sequence[Mapping[str, Any]], report: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(every incident, those that ``report`` closes, closed)."""
    at = parse_rfc3339(report.get("updatedAt"))
    step = report.get("step")
    out, closed = [], []
    for incident in incidents:
        entry = dict(incident)
        detected = parse_rfc3339(entry.get("detectedAt"))
        out.append(entry)
        if not is_open(entry) or at is None or step is None or detected is None:
            continue
        if at > detected:
            entry["resumedAt"] = report["updatedAt"]
            entry["seconds"] = round((at - detected).total_seconds(), 1)
            entry["resumedStep"] = step
            if "atStep" in entry:
                entry["stepsRedone"] = max(0, entry["atStep"] + 1 - step)
            closed.append(entry)
    return out, closed


def account(
    status: StatusFields, previous: Mapping[str, Any] | None, report: Mapping[str, Any]
) -> tuple[StatusFields, list[dict[str, Any]]]:
    """The status fields a new ``report`` changes (incidents, keptSeconds, goodput) given the
    ``status`` and the ``previous`` report it holds, and the incidents it closed."""
    incidents = status.get("incidents") or []
    was_open = any(is_open(i) for i in incidents)
    incidents, closed = closing(incidents, report)
    kept = float(status.get("keptSeconds") or 0.0)
    prev = previous or {}
    now, then = parse_rfc3339(report.get("updatedAt")), parse_rfc3339(prev.get("updatedAt"))
    step, before = report.get("step"), prev.get("step")
    moved = step - before if step is not None and before is not None and step > before else 0
    per_step = reports.step_seconds(prev)
    between = None  # the seconds since the report before
    if now is not None and then is not None and now > then:
        between = (now - then).total_seconds()
    added = 0.0
    if moved and between is not None:
        added = between
        if was_open:  # steps trained across an incident: at most at the pace before it
            added = min(between, moved * per_step)
    redone = max((i.get("stepsRedone", 0) for i in closed), default=0) * per_step  # one outage
    kept = max(0.0, kept + added - redone)
    out = StatusFields(keptSeconds=round(kept, 1))
    held = float(status.get("heldSeconds") or 0.0)
    paused = prev.get("heldAtStep") is not None
    if paused and between is not None:
        held += between  # paused from the last report to this one: neither kept nor lost
        out["heldSeconds"] = round(held, 1)
    if closed and between is not None:
        lost = round(max(0.0, (0.0 if paused else between) - added) + redone, 1)
        for incident in closed:
            incident["lostSeconds"] = lost
    if closed:
        out["incidents"] = incidents
    first = status.get("firstReportTime") or first_report(status, previous, report)
    if first is not None and first != status.get("firstReportTime"):
        out["firstReportTime"] = first
    began = parse_rfc3339(first)
    training = (now - began).total_seconds() - held if began and now else 0.0
    if training > 0:
        out["goodput"] = round(min(1.0, kept / training), 3)
    return out, closed


def first_report(
    status: StatusFields, previous: Mapping[str, Any] | None, report: Mapping[str, Any]
) -> str | None:
    """When training began, for a status that has no ``firstReportTime`` yet: ``report``'s
    time when it is the first, else (reports came before an operator that kept this field)
    ``startTime``, as goodput counted before."""
    if previous is None:
        return report.get("updatedAt")
    return status.get("startTime")


def open_incident(
    status: StatusFields, new: StatusFields, kind: str, now: str
) -> list[dict[str, Any]]:
    """The incidents after one of ``kind`` detected ``now`` (``new``: this plan's status so
    far, whose incidents are newer than ``status``'s)."""
    incidents = new["incidents"] if "incidents" in new else status.get("incidents")
    progress = new.get("progress") or status.get("progress")
    return opened(incidents or [], kind, now, progress)
