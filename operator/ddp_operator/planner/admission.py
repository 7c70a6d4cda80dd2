"""A job in a Kueue queue: the ``Queued`` phase while Kueue has not admitted it (or evicted it),
and the ``Admitted`` condition and Events once it has."""

from __future__ import annotations

from ddp_api.ddpjob import ConditionStatus, DDPJobPhase, Reason

from .. import queueing
from .draft import ADMITTED, Draft, Plan


def queued(st: Draft, prev_phase: str, adm: queueing.Admission) -> Plan:
    """Not admitted by Kueue (yet, or again after an eviction): no pods."""
    live = st.live
    st.delete(live)
    reason = adm.reason or adm.state.value
    if adm.state == queueing.State.EVICTED:
        cq = st.status.get("clusterQueue")
        if cq:  # the first reconcile that sees this eviction
            st.plan.warn(
                Reason.EVICTED,
                f"Kueue evicted the job from ClusterQueue {cq} ({reason}: {adm.message});"
                f" deleting {len(live)} pods: rank 0 checkpoints on SIGTERM, and training"
                " resumes from that checkpoint when Kueue admits the job again",
            )
        message = (
            f"evicted ({reason}): {adm.message}; waiting for Kueue to admit it again from"
            f" LocalQueue {adm.queue}"
        )
    else:
        if prev_phase != DDPJobPhase.QUEUED and not st.status.get("admissions"):
            st.plan.info(
                Reason.QUEUED, f"waiting for Kueue to admit it from LocalQueue {adm.queue}"
            )
        message = f"waiting in LocalQueue {adm.queue}: {adm.message}"
    st.admitted = {
        "type": ADMITTED,
        "status": ConditionStatus.FALSE,
        "reason": reason,
        "message": message,
    }
    st.new["clusterQueue"] = None
    st.new["startTime"] = None  # activeDeadlineSeconds counts time since the last admission
    return st.result(DDPJobPhase.QUEUED, reason, message)


def admitted(st: Draft, adm: queueing.Admission) -> None:
    """Admitted by Kueue: an Event the first time this admission is seen."""
    cq = adm.cluster_queue
    nodes = st.job.spec.nodes
    flavors = f" on flavor {', '.join(adm.flavors)}" if adm.flavors else ""
    message = f"admitted by ClusterQueue {cq}: {nodes} nodes{flavors}"
    st.admitted = {
        "type": ADMITTED,
        "status": ConditionStatus.TRUE,
        "reason": adm.reason or ADMITTED,
        "message": message,
    }
    if st.status.get("clusterQueue") == cq:
        return
    n = int(st.status.get("admissions") or 0) + 1
    st.new["admissions"] = n
    st.new["clusterQueue"] = cq
    if n == 1:
        st.plan.info(Reason.ADMITTED, f"Kueue {message} ({adm.reason}: {adm.message})")
    else:
        st.plan.info(
            Reason.READMITTED,
            f"Kueue {message} ({adm.reason}: {adm.message}); admission {n}: training resumes"
            " from the newest checkpoint",
        )
