"""The end of a job: once any node pod exits 0 (its torchrun finished training) the job is
complete; the others get ``completion_grace_s`` to finish (the package docstring). The policy
reads the draft and returns its :class:`~.decision.Decision`."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from ddp_api.contract import parse_rfc3339
from ddp_api.ddpjob import ConditionStatus, DDPJobPhase, Reason
from ddp_api.pods import PodPhase
from ddp_api.status import StatusFields

from .. import render
from .decision import NOTHING, Decision, Outcome
from .draft import Draft
from .views import PodView

COMPLETION_GRACE_S = 90.0  # Settings.completion_grace_s: the default


def completion(st: Draft, grace_s: float) -> Decision:
    """Once a node's torchrun exited 0 training is complete: nothing to do before. Reads
    ``st`` only."""
    workers = st.workers
    succeeded = [x for x in workers if x.phase == PodPhase.SUCCEEDED]
    if not succeeded:
        return NOTHING
    first = min(
        succeeded, key=lambda x: (parse_rfc3339(x.finished or x.created) or st.now, x.index)
    )
    known = set(st.handled)
    nodes = st.job.spec.nodes
    lost = [
        x
        for x in workers
        if x.index < nodes and (x.phase == PodPhase.FAILED or (x.deleting and not x.done))
    ]
    # Not failures: the job is complete; recorded so they never count later.
    handled = tuple(x.uid for x in lost)
    running = st.running
    done_at = parse_rfc3339(first.finished or first.created) or st.now
    left = (done_at - st.now).total_seconds() + grace_s
    if running and left > 0:
        names = ", ".join(x.name for x in running)
        return Decision(
            handled=handled,
            requeue_after=left,
            outcome=Outcome(
                DDPJobPhase.RUNNING,
                Reason.NODES_COMPLETING,
                f"{first.name} completed training; waiting up to {left:.0f}s more for {names}",
            ),
        )
    if _completing(st.status):  # whatever went since the first success was seen went after it
        known = set()
    message = completion_message(st.name, first, lost, running, known, nodes, succeeded, grace_s)
    completed = Outcome(DDPJobPhase.SUCCEEDED, Reason.COMPLETED, message, ends=True)
    return Decision(handled=handled, outcome=completed)


def _completing(status: StatusFields) -> bool:
    """Whether the last plan saw a node finished and waited for the rest."""
    return any(
        c.get("reason") == Reason.NODES_COMPLETING and c.get("status") == ConditionStatus.TRUE
        for c in status.get("conditions") or []
    )


def completion_message(
    job: str,
    first: PodView,
    lost: list[PodView],
    late: list[PodView],
    known: Collection[str],
    nodes: int,
    succeeded: list[PodView],
    grace_s: float,
) -> str:
    """Says which nodes did not finish, and how: lost after ``first`` completed training (not
    ``known`` as lost before; ``known`` is empty once the job was seen completing), lost
    before it (known, or missing), or still running past the grace."""

    def names(pods: Iterable[str]) -> tuple[str, str]:
        pods = sorted(set(pods))
        return ", ".join(pods), "was" if len(pods) == 1 else "were"

    done = {x.index for x in succeeded}
    after = [x.name for x in lost if x.uid not in known and x.index not in done]
    before = [x.name for x in lost if x.uid in known and x.index not in done]
    seen = {x.index for x in lost} | {x.index for x in late}
    missing = [render.worker_name(job, i) for i in range(nodes) if i not in done | seen]
    (before if known else after).extend(missing)
    parts = []
    if after:
        who, was = names(after)
        parts.append(f"{who} {was} lost after {first.name} completed training")
    if before:
        who, was = names(before)
        parts.append(f"{who} {was} lost before {first.name} completed training, and not replaced")
    if late:
        who, was = names(x.name for x in late)
        parts.append(
            f"{who} did not finish within {grace_s:.0f}s after {first.name} completed training"
            f" and {was} stopped"
        )
    return "; ".join(parts) or f"all {len(succeeded)} nodes exited 0"
