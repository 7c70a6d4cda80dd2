"""PerStep mode's replica groups: the job stays Running while at least ``minGroups`` groups
train, and a lost lighthouse restarts nothing."""

from __future__ import annotations

from ddp_api.ddpjob import DDPJobPhase, Reason

from .draft import Draft

LIGHTHOUSE_GONE = (
    "the replica groups wait for a quorum until it answers, then go on from the step they were"
    " at: none is restarted"
)


def groups_phase(
    st: Draft, prev_phase: str, running: int, wait: float, scaling_down: bool
) -> tuple[DDPJobPhase, str, str] | None:
    """A PerStep job that has run, with at least minGroups groups ready but not all of the
    spec.nodes: still Running (the ready groups train every step) while the others are
    replaced, added or removed; None when another rule applies (all ready, or too few)."""
    s = st.job.spec
    ft = s.fault_tolerance
    if ft is None or not ft.per_step or running < ft.groups_min:
        return None
    if running == s.nodes and not scaling_down:
        return None
    if prev_phase not in (DDPJobPhase.RUNNING, DDPJobPhase.RESTARTING, DDPJobPhase.SCALING):
        return None
    message = (
        f"replica groups ready: at least {ft.groups_min} of {s.nodes} train each step while"
        " the others start or stop"
    )
    if "lastFailureTime" in st.new:  # a failure counted now: say it here too
        message += f"; restart {st.restarts} of backoffLimit {s.backoff_limit}"
        if wait > 0:
            message += f", recreating in {wait:.0f}s"
        if st.cause is not None:
            message = f"{st.cause[1]}; {message}"
    return DDPJobPhase.RUNNING, Reason.GROUPS_CHANGING, message
