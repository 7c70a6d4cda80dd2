"""How a lost pod is counted: a disruption, a consequence of the last counted loss, or a
failure against ``backoffLimit`` (the package docstring); what fails the job at once. The
policy reads the draft and returns its :class:`~.decision.Decision`."""

from __future__ import annotations

import datetime as dt

from ddp_api.contract import parse_rfc3339
from ddp_api.ddpjob import DDPJobPhase, DDPJobSpec, EventType, IncidentKind, Reason, RestartPolicy
from ddp_api.pods import PodPhase
from ddp_api.status import StatusFields

from .. import diagnosis, render
from .decision import Decision, EventNote, Outcome
from .draft import Draft
from .groups import LIGHTHOUSE_GONE
from .views import DISRUPTION_TARGET, SERVER_ROLES, PodView, vanished

DISRUPTION_WINDOW_S = 60.0
SAME_DELETION_S = 5.0


def is_permanent(policy: str, exit_code: int | None) -> bool:
    """Whether a failed pod fails the job instead of being recreated."""
    if policy == RestartPolicy.NEVER:
        return True
    if policy == RestartPolicy.EXIT_CODE:
        # 1-127: the program chose to fail; 128+: killed by a signal (preemption, OOM).
        return exit_code is not None and 1 <= exit_code <= 127
    return False


def follows_disruption(
    pod: PodView, failed: bool, last_counted: dt.datetime | None, now: dt.datetime
) -> bool:
    """Whether ``pod``'s failure (``failed``) or deletion is part of the disruption counted at
    ``last_counted``: the pod is older than it, and it came within the window (package docs)."""
    created = parse_rfc3339(pod.created)
    window = DISRUPTION_WINDOW_S if failed else SAME_DELETION_S
    return (
        last_counted is not None
        and created is not None
        and created < last_counted
        and (now - last_counted).total_seconds() <= window
    )


def last_counted(status: StatusFields) -> dt.datetime | None:
    """When the last failure or disruption was counted: what later losses may follow."""
    stamps = [parse_rfc3339(status.get("lastFailureTime"))]
    stamps.append(parse_rfc3339(status.get("lastDisruptionTime")))
    return max((t for t in stamps if t is not None), default=None)


def _new_failures(st: Draft) -> tuple[list[tuple[PodView, bool]], list[PodView]]:
    """(pod, failed: else deleted while running or marked for a disruption) not counted yet, a
    disrupted or deleted pod first: it is the likelier cause of what failed with it, and the
    one an Event names; and the failed pods counted before whose deletion did not happen yet."""
    nodes = st.job.spec.nodes
    new: list[tuple[PodView, bool]] = []
    again: list[PodView] = []
    gone = vanished(st.name, st.status.get("seenRunning") or {}, st.pods, st.handled)
    unseen = {x.uid for x in gone}
    for x in [*(x for x in st.pods if x.uid not in unseen), *gone]:
        in_job = x.role in SERVER_ROLES or 0 <= x.index < nodes
        failed = x.phase == PodPhase.FAILED and not x.deleting
        # DisruptionTarget is set before the pod goes: counted when seen, even before deletion.
        disrupted = in_job and (x.vanished or (not x.done and (x.deleting or bool(x.disrupted))))
        if x.uid in st.handled:
            if failed:
                again.append(x)
            continue
        if failed or disrupted:
            new.append((x, failed))
    new.sort(
        key=lambda pair: (
            pair[1] and not pair[0].disrupted,
            pair[0].role not in SERVER_ROLES,
            pair[0].index,
        )
    )
    return new, again


def _what(
    x: PodView, failed: bool, spec: DDPJobSpec, found: diagnosis.Finding | None = None
) -> str:
    if x.disrupted:
        return f"was disrupted ({DISRUPTION_TARGET}: {x.disrupted})"
    if x.vanished:
        return "was deleted before the operator saw it go (no replica led, or it went at once)"
    if not failed:
        return "was deleted while running"
    code = "" if x.exit_code is None else f" (exit code {x.exit_code})"
    if found is not None and found.reason == diagnosis.OOM:
        return f"failed{code}: {diagnosis.message(found, [x])}"
    if found is not None and x.problem is not None:
        return f"could not start{code}: {x.problem.reason}: {x.problem.message}"
    if x.exit_code is not None:
        hint = diagnosis.killed_hint(x, spec) or diagnosis.said(x)
        return f"failed with exit code {x.exit_code}{hint}"
    return f"failed ({x.reason or 'no exit code'})"


def failures(st: Draft) -> Decision:
    """Counts each new disruption, and each failure that follows none (package docstring); the
    decision ends the job when one fails it. Reads ``st`` only: it counts on its own."""
    s = st.job.spec
    last = last_counted(st.status)
    new, again = _new_failures(st)
    handled: list[str] = []
    delete = list(again)  # counted before; their deletion did not happen yet
    kinds: list[IncidentKind] = []
    events: list[EventNote] = []
    disruptions = counted = 0
    cause: tuple[str, str] | None = None

    def decided(reason: str = "", message: str = "") -> Decision:
        """What was counted so far; the job Failed with ``reason`` when there is one."""
        ends = Outcome(DDPJobPhase.FAILED, reason, message, ends=True) if reason else None
        return Decision(
            handled=tuple(handled),
            delete=tuple(delete),
            incidents=tuple(kinds),
            disruptions=disruptions,
            failures=counted,
            events=tuple(events),
            cause=cause,
            outcome=ends,
        )

    for x, failed in new:
        handled.append(x.uid)
        worker = x.role == render.ROLE_WORKER
        # Training finished: the job cannot fail, in either mode (seen on kind: a Restart-mode
        # node that trained the last step with its peer segfaulted on its way out, before the
        # peer's exit 0 was seen, and was counted as a restart; with its budget spent it
        # would have failed a job whose training had finished).
        if worker and st.trained():
            delete += [x] if failed else []
            whole = "a replica group" if s.per_step else "a node"
            text = (
                f"{x.name} {_what(x, failed, s)} after training reached its last step: not"
                f" counted (the job completes once {whole} exits 0)"
            )
            events.append((EventType.NORMAL, Reason.LOST_AFTER_TRAINING, text))
            continue
        found = diagnosis.finding(x, s) if failed and not x.disrupted else None
        if found is not None and found.outcome == diagnosis.Effect.FAILS:
            return decided(found.reason, diagnosis.message(found, [x]))
        what = _what(x, failed, s, found)
        if found is not None and found.outcome == diagnosis.Effect.COUNTED:
            cause = (found.reason, f"{x.name} {what}")
        elif failed and diagnosis.said(x):  # the worker said why: the condition says it too
            cause = (Reason.POD_FAILED, f"{x.name} {what}")
        # PerStep: a pod deleted while it runs took nothing down with it, whoever deleted it.
        # One gone unseen: why is not known, so it is not held against backoffLimit.
        if worker and (x.disrupted or x.vanished or (s.per_step and not failed)):
            delete += [x] if failed else []
            kinds.append(IncidentKind.DISRUPTION)
            disruptions += 1
            last = st.now
            alone = "recreating it"
            if s.per_step:
                alone = "replacing it alone: the other replica groups keep training"
            text = (
                f"{x.name} {what}; {alone} (disruption {st.disruptions + disruptions};"
                f" disruptions do not count against backoffLimit {s.backoff_limit})"
            )
            events.append((EventType.WARNING, Reason.DISRUPTION, text))
            continue
        if failed and worker and is_permanent(s.restart_policy, x.exit_code):
            return decided(
                Reason.POD_FAILED,
                f"{x.name} {what}; restartPolicy {s.restart_policy.value} treats it as permanent",
            )
        delete += [x] if failed else []
        if x.role == render.ROLE_STORE:
            kinds.append(IncidentKind.STORE_LOST)
            text = (
                f"{x.name} {what}; recreating it: the nodes wait for the new store, rendezvous"
                " again and resume from the newest checkpoint (no restart counted)"
            )
            events.append((EventType.WARNING, Reason.STORE_LOST, text))
            continue
        if x.role == render.ROLE_LIGHTHOUSE:
            kinds.append(IncidentKind.LIGHTHOUSE_LOST)
            text = f"{x.name} {what}; recreating it (no restart counted; {LIGHTHOUSE_GONE})"
            events.append((EventType.WARNING, Reason.LIGHTHOUSE_LOST, text))
            continue
        # PerStep: groups fail alone (a survivor never dies because a peer did), so no failure
        # is another's consequence.
        if not s.per_step and follows_disruption(x, failed, last, st.now):
            continue  # counted with the failure or disruption that began this
        last = st.now
        kinds.append(IncidentKind.FAILURE)
        counted += 1
        restarts = st.restarts + counted
        if restarts > s.backoff_limit:
            return decided(
                Reason.BACKOFF_LIMIT_EXCEEDED,
                f"{x.name} {what}; the job already used its backoffLimit of"
                f" {s.backoff_limit} restarts",
            )
        text = (
            f"{x.name} {what}; recreating it (restart {restarts} of backoffLimit"
            f" {s.backoff_limit}; failures of older pods within {DISRUPTION_WINDOW_S:.0f}s"
            " count with this one)"
        )
        events.append(
            (EventType.WARNING, Reason.POD_FAILED if failed else Reason.POD_DISRUPTED, text)
        )
    return decided()
