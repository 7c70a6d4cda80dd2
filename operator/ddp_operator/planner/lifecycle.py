"""The job's life outside its pods' failures: ``activeDeadlineSeconds``, a finished job's TTL,
and ``spec.suspend``."""

from __future__ import annotations

from ddp_api.contract import parse_rfc3339, rfc3339
from ddp_api.ddpjob import DDPJobPhase, Reason

from .. import render
from .draft import Decision, Draft, Outcome, Plan


def past_deadline(st: Draft) -> Decision:
    """Sets ``startTime`` on the first reconcile; the job Failed once it has run longer than
    ``activeDeadlineSeconds``, else a reconcile is due when it would. Reads ``st`` only."""
    start = parse_rfc3339(st.status.get("startTime"))
    first = {}
    if start is None:
        start = st.now
        first = {"startTime": rfc3339(st.now)}
    deadline = st.job.spec.active_deadline_seconds
    if deadline is None:
        return Decision(status=first)
    left = (start - st.now).total_seconds() + deadline
    if left <= 0:
        message = f"the job ran longer than activeDeadlineSeconds={deadline}"
        ends = Outcome(DDPJobPhase.FAILED, Reason.DEADLINE_EXCEEDED, message, ends=True)
        return Decision(status=first, outcome=ends)
    return Decision(status=first, requeue_after=left)


def finished(st: Draft, prev_phase: str) -> Plan:
    """A Succeeded or Failed job: free what still runs, delete the job when its TTL is due."""
    st.delete(x for x in st.live if not x.done or x.role != render.ROLE_WORKER)
    ttl = st.job.spec.ttl_seconds_after_finished
    if ttl is not None:
        done_at = parse_rfc3339(st.status.get("completionTime")) or st.now
        left = (done_at - st.now).total_seconds() + ttl
        if left <= 0:
            st.plan.delete_job = True
            st.plan.info(
                Reason.TTL_EXPIRED,
                f"deleting {st.name}: it finished {prev_phase} more than {ttl}s ago"
                " (ttlSecondsAfterFinished)",
            )
        else:
            st.plan.requeue(left)
    return st.result(None)


def suspended(st: Draft, prev_phase: str) -> Plan:
    """A job with ``spec.suspend`` true: no pods; the checkpoints stay."""
    live = st.live
    st.delete(live)
    if prev_phase != DDPJobPhase.SUSPENDED:
        st.plan.info(
            Reason.SUSPENDED,
            f"spec.suspend is true: deleting {len(live)} pods; the checkpoints are kept and"
            " training resumes from them when spec.suspend is false again",
        )
    st.new["startTime"] = None  # activeDeadlineSeconds counts time since the last resume
    return st.result(DDPJobPhase.SUSPENDED, Reason.SUSPENDED, "spec.suspend is true")
