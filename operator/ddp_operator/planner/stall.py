"""The progress deadline: a Running job whose step has not moved for it is restarted, once as
a disruption, again at the same step as a failure; the policy reads the draft and returns its
:class:`~.decision.Decision`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddp_api.contract import parse_rfc3339
from ddp_api.ddpjob import DDPJobPhase, EventType, IncidentKind, Reason
from ddp_api.status import StatusFields

from .. import render, reports
from .conditions import condition
from .decision import NOTHING, Decision, Outcome
from .draft import Draft

PROGRESS_DEADLINE_FLOOR_S = 600.0  # spec.progressDeadlineSeconds unset: at least this ...
STEP_TIMES_PER_DEADLINE = 10  # ... or this many of the recent step time, whichever is longer


def progress_deadline_s(spec_s: int | None, progress: Mapping[str, Any] | None) -> float:
    """How long a Running job may go without a step (0: no limit): ``spec_s`` when set, else
    :data:`PROGRESS_DEADLINE_FLOOR_S` or :data:`STEP_TIMES_PER_DEADLINE` step times, the step
    time read from the time left for the steps left (the pace of the last two reports)."""
    if spec_s is not None:
        return float(spec_s)
    return max(PROGRESS_DEADLINE_FLOOR_S, STEP_TIMES_PER_DEADLINE * reports.step_seconds(progress))


def stepped_since_running(status: StatusFields) -> bool:
    """Whether a report came (``lastStepTime``) since the job last became Running."""
    last = parse_rfc3339(status.get("lastStepTime"))
    running = parse_rfc3339(condition(status, DDPJobPhase.RUNNING).get("lastTransitionTime"))
    return last is not None and (running is None or last >= running)


def stall(st: Draft, prev_phase: str) -> Decision:
    """Restarts a job that was Running with every node ready and whose step has not moved for
    its progress deadline (:func:`progress_deadline_s`), counted from rank 0's last report of a
    new step (or its first report since the job became Running): every node pod is deleted
    (the store stays) and recreated. Until a report comes after the job became Running, it is
    starting (loading data, compiling), not stalled. The first stall at a step is a disruption;
    another at the same step (it hangs where it hung) is a failure, against backoffLimit. Not
    while held or after the last step. Reads ``st`` only."""
    s = st.job.spec
    progress = st.progress
    deadline = progress_deadline_s(s.progress_deadline_seconds, progress)
    if not deadline or prev_phase != DDPJobPhase.RUNNING:
        return NOTHING
    # PerStep: the groups ready train without the others, so they may stall without them.
    ft = s.fault_tolerance if s.per_step else None
    if st.status.get("reason") not in (
        Reason.ALL_NODES_RUNNING,
        *([Reason.GROUPS_CHANGING] if ft else []),
    ):
        return NOTHING
    p = progress or {}
    step, total = p.get("step"), p.get("totalSteps")
    if p.get("heldAtStep") is not None or (
        step is not None and total is not None and step >= total
    ):
        return NOTHING
    workers = st.running
    if len([x for x in workers if x.ready and x.index < s.nodes]) < (
        ft.groups_min if ft else s.nodes
    ):
        return NOTHING
    seen: StatusFields = {
        **st.status,
        "lastStepTime": st.new.get("lastStepTime", st.status.get("lastStepTime")),
    }
    if not stepped_since_running(seen):
        return NOTHING
    since = parse_rfc3339(seen["lastStepTime"])
    assert since is not None  # stepped_since_running said so
    quiet_s = (st.now - since).total_seconds()
    if quiet_s < deadline:
        return Decision(requeue_after=deadline - quiet_s)
    at = "before the first step" if step is None else f"at step {step}"
    setting = "progressDeadlineSeconds" + (
        " (default)" if s.progress_deadline_seconds is None else ""
    )
    what = (
        f"no training step for {quiet_s:.0f}s {at} ({setting} {deadline:.0f}): deleting the"
        " node pods and recreating them"
    )
    # the bundled trainer's workers (ddp_trainer.reporting.stacks)
    if render.reports_progress(st.job):
        what += " (each worker wrote every thread's stack to its log)"
    pods, stalled_at = tuple(workers), StatusFields(stalledAtStep=step)
    if step is None or st.status.get("stalledAtStep") != step:  # the first stall here
        n = st.disruptions + 1
        message = f"{what}; disruption {n}, not against backoffLimit (a second stall here is)"
        return Decision(
            delete=pods,
            status=stalled_at,
            incidents=(IncidentKind.STALLED,),
            disruptions=1,
            events=((EventType.WARNING, Reason.STALLED, message),),
            outcome=Outcome(DDPJobPhase.RESTARTING, Reason.STALLED, message),
        )
    restarts = st.restarts + 1  # this one counted
    if restarts > s.backoff_limit:
        message = (
            f"{what}; stalled at this step before, and the job already used its backoffLimit"
            f" of {s.backoff_limit} restarts"
        )
        ends = Outcome(DDPJobPhase.FAILED, Reason.STALLED, message, ends=True)
        return Decision(
            delete=pods,
            status=stalled_at,
            failures=1,
            incidents=(IncidentKind.STALLED,),
            outcome=ends,
        )
    message = f"{what}; stalled at this step before: restart {restarts} of backoffLimit"
    message += f" {s.backoff_limit}"
    return Decision(
        delete=pods,
        status=stalled_at,
        failures=1,
        incidents=(IncidentKind.STALLED,),
        events=((EventType.WARNING, Reason.STALLED, message),),
        outcome=Outcome(DDPJobPhase.RESTARTING, Reason.STALLED, message),
    )
