"""What stops the pods (an image that cannot be pulled, a missing claim, ..., read by
:mod:`ddp_operator.diagnosis`): the problem the job shows, and the end of a job it fails; the
policy reads the draft and returns its :class:`~.decision.Decision`."""

from __future__ import annotations

from ddp_api.ddpjob import DDPJobPhase

from .. import diagnosis
from .decision import Decision, Outcome
from .draft import Draft


def diagnosed(st: Draft) -> tuple[Decision, diagnosis.Diagnosis | None]:
    """The running pods' problem that the job shows (None: none), and the decision: a
    reconcile is due when what they show may have settled or when the problem fails the job;
    the job Failed once it does (not a job past its last step: a node will exit 0).
    Reads ``st`` only."""
    s = st.job.spec
    alive = [x for x in st.live if not x.done]
    waits = [diagnosis.settled_in(alive, s, st.now)]
    found = diagnosis.diagnose(alive, s, st.now)
    ends = None
    if found is not None and found.fails_in is not None:
        if found.fails_in > 0:
            waits.append(found.fails_in)
        elif not st.trained():
            ends = Outcome(DDPJobPhase.FAILED, found.reason, found.failed, ends=True)
    due = min((w for w in waits if w is not None), default=None)
    return Decision(requeue_after=due, outcome=ends), found
