"""A job in a Kueue queue: the ``Queued`` phase while Kueue has not admitted it (or evicted it),
and the ``Admitted`` condition and Events once it has; each policy reads the draft and returns
its :class:`~.decision.Decision`."""

from __future__ import annotations

from typing import Any

from ddp_api.ddpjob import ConditionStatus, DDPJobPhase, EventType, Reason

from .. import queueing
from .conditions import ADMITTED
from .decision import Decision, EventNote, Outcome
from .draft import Draft


def queued(st: Draft, prev_phase: str, adm: queueing.Admission) -> Decision:
    """Not admitted by Kueue (yet, or again after an eviction): no pods. Reads ``st`` only."""
    live = tuple(st.live)
    reason = adm.reason or adm.state.value
    events: tuple[EventNote, ...] = ()
    if adm.state == queueing.State.EVICTED:
        cq = st.status.get("clusterQueue")
        if cq:  # the first reconcile that sees this eviction
            text = (
                f"Kueue evicted the job from ClusterQueue {cq} ({reason}: {adm.message});"
                f" deleting {len(live)} pods: rank 0 checkpoints on SIGTERM, and training"
                " resumes from that checkpoint when Kueue admits the job again"
            )
            events = ((EventType.WARNING, Reason.EVICTED, text),)
        message = (
            f"evicted ({reason}): {adm.message}; waiting for Kueue to admit it again from"
            f" LocalQueue {adm.queue}"
        )
    else:
        if prev_phase != DDPJobPhase.QUEUED and not st.status.get("admissions"):
            text = f"waiting for Kueue to admit it from LocalQueue {adm.queue}"
            events = ((EventType.NORMAL, Reason.QUEUED, text),)
        message = f"waiting in LocalQueue {adm.queue}: {adm.message}"
    return Decision(
        delete=live,
        admitted=_condition(ConditionStatus.FALSE, reason, message),
        status={
            "queue": adm.queue,
            "clusterQueue": None,
            "admittedNodes": None,
            "startTime": None,  # activeDeadlineSeconds counts time since the last admission
        },
        events=events,
        outcome=Outcome(DDPJobPhase.QUEUED, reason, message),
    )


def admitted(st: Draft, adm: queueing.Admission) -> Decision:
    """Admitted by Kueue: the condition, Kueue's admitted node count (``admittedNodes``: the
    user's ``spec.nodes`` is left as asked; ``st.job`` is the job as it runs under the
    admission, :func:`~ddp_operator.queueing.admitted_job`, with the smaller of the two), and
    an Event the first time this admission is seen. Reads ``st`` only."""
    cq = adm.cluster_queue
    nodes = st.job.spec.nodes
    count = nodes if adm.count is None else adm.count  # Kueue's, beside spec.nodes
    flavors = f" on flavor {', '.join(adm.flavors)}" if adm.flavors else ""
    message = f"admitted by ClusterQueue {cq}: {nodes} nodes{flavors}"
    condition = _condition(ConditionStatus.TRUE, adm.reason or ADMITTED, message)
    if st.status.get("clusterQueue") == cq:
        return Decision(admitted=condition, status={"queue": adm.queue, "admittedNodes": count})
    n = int(st.status.get("admissions") or 0) + 1
    if n == 1:
        text = f"Kueue {message} ({adm.reason}: {adm.message})"
        event = (EventType.NORMAL, Reason.ADMITTED, text)
    else:
        text = (
            f"Kueue {message} ({adm.reason}: {adm.message}); admission {n}: training resumes"
            " from the newest checkpoint"
        )
        event = (EventType.NORMAL, Reason.READMITTED, text)
    return Decision(
        admitted=condition,
        status={"queue": adm.queue, "admissions": n, "clusterQueue": cq, "admittedNodes": count},
        events=(event,),
    )


def _condition(status: ConditionStatus, reason: str, message: str) -> dict[str, Any]:
    return {"type": ADMITTED, "status": status, "reason": reason, "message": message}
