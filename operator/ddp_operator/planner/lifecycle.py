"""The job's life outside its pods' failures: ``activeDeadlineSeconds``, a finished job's TTL,
and ``spec.suspend``; each policy reads the draft and returns its :class:`~.decision.Decision`."""

from __future__ import annotations

from ddp_api.contract import parse_rfc3339, rfc3339
from ddp_api.ddpjob import DDPJobPhase, EventType, Reason
from ddp_api.status import StatusFields

from .. import queueing, render
from .decision import NOTHING, Decision, EventNote, Outcome
from .draft import Draft


def past_deadline(st: Draft) -> Decision:
    """Sets ``startTime`` on the first reconcile; the job Failed once it has run longer than
    ``activeDeadlineSeconds``, else a reconcile is due when it would. Reads ``st`` only."""
    start = parse_rfc3339(st.status.get("startTime"))
    first = StatusFields()
    if start is None:
        start = st.now
        first = StatusFields(startTime=rfc3339(st.now))
    deadline = st.job.spec.active_deadline_seconds
    if deadline is None:
        return Decision(status=first)
    left = (start - st.now).total_seconds() + deadline
    if left <= 0:
        message = f"the job ran longer than activeDeadlineSeconds={deadline}"
        ends = Outcome(DDPJobPhase.FAILED, Reason.DEADLINE_EXCEEDED, message, ends=True)
        return Decision(status=first, outcome=ends)
    return Decision(status=first, requeue_after=left)


def finished(st: Draft, prev_phase: str) -> Decision:
    """A Succeeded or Failed job: free what still runs, delete the job when its TTL is due; the
    phase stays. Reads ``st`` only."""
    free = tuple(x for x in st.live if not x.done or x.role != render.ROLE_WORKER)
    stays = Outcome(None, "", "")
    ttl = st.job.spec.ttl_seconds_after_finished
    if ttl is None:
        return Decision(delete=free, outcome=stays)
    done_at = parse_rfc3339(st.status.get("completionTime")) or st.now
    left = (done_at - st.now).total_seconds() + ttl
    if left > 0:
        return Decision(delete=free, requeue_after=left, outcome=stays)
    message = (
        f"deleting {st.name}: it finished {prev_phase} more than {ttl}s ago"
        " (ttlSecondsAfterFinished)"
    )
    return Decision(
        delete=free,
        delete_job=True,
        events=((EventType.NORMAL, Reason.TTL_EXPIRED, message),),
        outcome=stays,
    )


def suspended(st: Draft, prev_phase: str, admission: queueing.Admission | None) -> Decision:
    """A job with ``spec.suspend`` true: no pods; the checkpoints stay. Reads ``st`` only."""
    live = tuple(st.live)
    events: tuple[EventNote, ...] = ()
    if prev_phase != DDPJobPhase.SUSPENDED:
        message = (
            f"spec.suspend is true: deleting {len(live)} pods; the checkpoints are kept and"
            " training resumes from them when spec.suspend is false again"
        )
        events = ((EventType.NORMAL, Reason.SUSPENDED, message),)
    status = StatusFields()
    if admission is not None and admission.state != queueing.State.ADMITTED:
        status["clusterQueue"] = None  # Kueue took the quota back (Workload inactive)
        status["admittedNodes"] = None
    status["startTime"] = None  # activeDeadlineSeconds counts time since the last resume
    return Decision(
        delete=live,
        status=status,
        events=events,
        outcome=Outcome(DDPJobPhase.SUSPENDED, Reason.SUSPENDED, "spec.suspend is true"),
    )


def resumed(prev_phase: str) -> Decision:
    """A job suspended until now: an Event says it resumes."""
    if prev_phase != DDPJobPhase.SUSPENDED:
        return NOTHING
    message = "spec.suspend is false: recreating pods, resuming from checkpoint"
    return Decision(events=((EventType.NORMAL, Reason.RESUMED, message),))
