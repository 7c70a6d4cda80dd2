"""What the planner sees of a pod and of a Kubernetes Node, read from their API bodies: pure,
and importing no policy, so that every policy (and :mod:`ddp_operator.diagnosis`) can use it."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ddp_api.contract import REFUSALS, SYNTAX_ERRORS, parse_rfc3339, termination_kind
from ddp_api.ddpjob import TERMINAL_PHASES, ConditionStatus, ProblemReason
from ddp_api.metav1 import controller_uid
from ddp_api.pods import IMAGE_PULL_REASONS, PodPhase, trainer_image, worker_index

from .. import render, reports

DISRUPTION_TARGET = "DisruptionTarget"  # the pod condition Kubernetes sets before a disruption
# The job's server pod: the rendezvous store (Restart mode) or the lighthouse (PerStep mode).
SERVER_ROLES = (render.ROLE_STORE, render.ROLE_LIGHTHOUSE)
SERVER_CONTAINERS = (render.STORE_CONTAINER, render.LIGHTHOUSE_CONTAINER)
CONTAINERS = (render.CONTAINER, *SERVER_CONTAINERS)

# The kubelet's and the runtime's reasons that :func:`problem` reads, beside
# ddp_api.pods.IMAGE_PULL_REASONS (what they mean for the job: :mod:`ddp_operator.diagnosis`).
CONFIG_REASONS = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
)
START_REASONS = frozenset({"StartError", "ContainerCannotRun"})
CRASH_LOOP = "CrashLoopBackOff"  # the kubelet's back-off after a container exited again
SERVER_RESTARTS_SAID = 2  # a server that crashed once mid-run is back before anyone must know
# A server run that ended sooner belongs to a crash loop; the kubelet too forgets a container's
# back-off once it ran 10 minutes.
SERVER_LOOP_RUN_S = 600
OOM = "OOMKilled"
UNSCHEDULABLE = "Unschedulable"
COMMAND_EXIT_CODES = (126, 127)  # a shell's "not executable" and "command not found"


@dataclass(frozen=True)
class PodProblem:
    """What a pod's status says stops it: a container's waiting or terminated reason, or the
    scheduler's (PodScheduled False), with its message and the container's image."""

    reason: str
    message: str = ""
    image: str = ""
    scheduler: bool = False  # the scheduler's (not placed yet), not a container's


def problem(pod: Mapping[str, Any]) -> PodProblem | None:
    """The problem a pod body shows, if any (a part of :func:`view`)."""
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") not in CONTAINERS:
            continue
        image = cs.get("image") or ""
        state = cs.get("state") or {}
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in IMAGE_PULL_REASONS | CONFIG_REASONS:
            return PodProblem(waiting["reason"], waiting.get("message") or "", image)
        # The servers restart in place (restartPolicy Always): their last end counts too.
        term = state.get("terminated") or (cs.get("lastState") or {}).get("terminated") or {}
        reason = term.get("reason") or ""
        if reason in START_REASONS or reason == OOM or term.get("exitCode") in COMMAND_EXIT_CODES:
            message = term.get("message") or f"exit code {term.get('exitCode')}"
            return PodProblem(reason or "Error", message, image)
        # The trainer's refusal to run, in its termination message (ddp_api.contract), or a
        # program that does not compile (SyntaxError, as the node wrapper read it).
        kind, words = termination_kind(term.get("message") or "")
        if kind in REFUSALS and term.get("exitCode"):
            return PodProblem(kind, words, image)
        if kind in SYNTAX_ERRORS and term.get("exitCode"):
            return PodProblem(ProblemReason.SYNTAX_ERROR, f"{kind}: {words}", image)
        # A server that keeps exiting: restarted twice or more, not ready since (its state
        # flips between ended, backing off and a moment's run, which would each say it anew;
        # both servers have a TCP readiness probe, so that run is not ready), and its last run
        # was short (one that ran for hours and crashed is starting again, not looping).
        # Its last words are its log's tail (the servers' terminationMessagePolicy is
        # FallbackToLogsOnError), of which the last line says why.
        ran = run_seconds(term)
        again = (
            (cs.get("restartCount") or 0) >= SERVER_RESTARTS_SAID
            and not cs.get("ready")
            and (ran is None or ran < SERVER_LOOP_RUN_S)
        )
        if cs["name"] in SERVER_CONTAINERS and again and term.get("exitCode"):
            said = [line for line in (term.get("message") or "").splitlines() if line.strip()]
            last = f": {said[-1].strip()[:300]}" if said else ""
            why = f"exit code {term.get('exitCode')}{last}"
            return PodProblem(CRASH_LOOP, why, image)
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == ConditionStatus.FALSE:
            reason = c.get("reason") or UNSCHEDULABLE
            return PodProblem(reason, c.get("message") or "", scheduler=True)
    return None


def run_seconds(term: Mapping[str, Any]) -> float | None:
    """How long an ended container ran, from its ``terminated`` state; None when unsaid."""
    start, end = parse_rfc3339(term.get("startedAt")), parse_rfc3339(term.get("finishedAt"))
    return (end - start).total_seconds() if start and end else None


@dataclass(frozen=True)
class PodView:
    """What the planner needs to know of one observed pod."""

    name: str
    uid: str
    role: str
    index: int
    phase: str
    ready: bool
    deleting: bool
    exit_code: int | None = None
    reason: str = ""
    created: str = ""  # metadata.creationTimestamp (RFC 3339, seconds)
    account: str = ""  # spec.serviceAccountName ("" when it has none, or no credential)
    finished: str = ""  # the container's terminated.finishedAt (RFC 3339), once it ended
    disrupted: str = ""  # the DisruptionTarget condition's reason, when it is True
    machine: str = ""  # spec.nodeName: the Kubernetes Node it runs on
    problem: PodProblem | None = None  # what its status says stops it
    said: str = ""  # the worker container's termination message: why it failed, in its words
    progress: reports.Record | None = None  # the progress record rank 0 wrote into it, if any
    owner: str = ""  # the uid of the DDPJob that controls it ("" when none does)
    image: str = ""  # the image of its trainer container (a node pod's; "" for the servers)
    # Running when last looked at (status.seenRunning), its end not seen: :func:`vanished`.
    vanished: bool = False

    @property
    def done(self) -> bool:
        return self.phase in TERMINAL_PHASES


def view(pod: Mapping[str, Any]) -> PodView:
    """Reads a pod body from the API into a :class:`PodView`."""
    meta, status = pod.get("metadata", {}), pod.get("status") or {}
    labels = meta.get("labels") or {}
    exit_code, reason, finished, said = None, "", "", ""
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term and cs.get("name") in CONTAINERS:
            exit_code, reason = term.get("exitCode"), term.get("reason", "")
            finished = term.get("finishedAt") or ""
            if cs.get("name") == render.CONTAINER:
                said = term.get("message") or ""
    conds = {c.get("type"): c for c in status.get("conditions") or []}
    ready = (conds.get("Ready") or {}).get("status") == ConditionStatus.TRUE
    target = conds.get(DISRUPTION_TARGET) or {}
    disrupted = (
        (target.get("reason") or DISRUPTION_TARGET)
        if target.get("status") == ConditionStatus.TRUE
        else ""
    )
    phase = status.get("phase", PodPhase.PENDING)
    return PodView(
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        role=labels.get(render.LABEL_ROLE, ""),
        index=int(labels.get(render.LABEL_INDEX, "-1")),
        phase=phase,
        ready=ready and phase == PodPhase.RUNNING,
        deleting=bool(meta.get("deletionTimestamp")),
        exit_code=exit_code,
        reason=reason,
        created=meta.get("creationTimestamp") or "",
        account=(pod.get("spec") or {}).get("serviceAccountName") or "",
        finished=finished,
        disrupted=disrupted,
        machine=(pod.get("spec") or {}).get("nodeName") or "",
        problem=problem(pod),
        said=said,
        progress=reports.record_of_pod(pod),
        owner=controller_uid(meta),
        image=trainer_image(pod),
    )


def seen_running(pods: Iterable[PodView]) -> dict[str, str]:
    """``status.seenRunning``: name -> uid of each node pod running and ready (not being
    deleted), for :func:`vanished` to compare with at the next observation."""
    return {
        x.name: x.uid
        for x in pods
        if x.role == render.ROLE_WORKER and x.ready and not x.deleting and not x.done
    }


def vanished(
    job: str, seen: Mapping[str, str], pods: Iterable[PodView], handled: Collection[str]
) -> list[PodView]:
    """The node pods of ``seen`` (``status.seenRunning``: running when last looked at) whose
    end was not seen: gone, or ended (Failed) and being deleted, and not handled (deleted by
    the operator, or counted). A pod deleted while no operator replica led (a failover, an
    upgrade) or deleted and gone between two looks (grace period 0) is gone; one whose
    deletion stopped it in moments is Failed and being deleted (seen on kind: a PerStep
    group's pod deleted as the leader's was). Each marked ``vanished``; a gone one as a pod
    being deleted while it ran."""
    by_uid = {x.uid: x for x in pods}
    gone = []
    for name, uid in seen.items():
        index = worker_index(job, name)
        x = by_uid.get(uid)
        if index is None or uid in handled:
            continue
        if x is None:
            role, phase = render.ROLE_WORKER, PodPhase.RUNNING
            gone.append(PodView(name, uid, role, index, phase, ready=False, deleting=True))
        elif x.deleting and x.phase == PodPhase.FAILED:
            gone.append(x)
    return [dataclasses.replace(x, vanished=True) for x in gone]


def split_by_owner(pods: Iterable[PodView], uid: str) -> tuple[list[PodView], list[PodView]]:
    """The pods with a job's name label that job ``uid`` controls, and the others: an earlier
    job of that name whose pods the garbage collector has not deleted yet (``kubectl delete``
    then ``kubectl apply``), or pods that no job controls (orphaned by ``--cascade=orphan``,
    made by hand). A job neither counts nor adopts the others: an earlier run's pod that
    exited 0 would otherwise complete a job that never trained."""
    mine: list[PodView] = []
    others: list[PodView] = []
    for x in pods:
        (mine if x.owner == uid else others).append(x)
    return mine, others


@dataclass(frozen=True)
class MachineView:
    """What the planner needs to know of one Kubernetes Node: its Ready condition, and what
    decides whether a job's pod may be placed there (:mod:`.placement`)."""

    name: str
    ready: str  # True, False or Unknown
    since: str  # the Ready condition's lastTransitionTime (RFC 3339)
    # Set by the controller once the machine's kubelet has renewed its Lease for no less than
    # the grace period: when the operator last saw it renewed (RFC 3339, the operator's clock).
    silent_since: str = ""
    # Set by the controller when a silent machine is heard again, or a cordoned one is
    # uncordoned: when (RFC 3339, the operator's clock). A machine back within
    # kube-controller-manager's grace never turned Unknown, so its Ready condition's time does
    # not say it was away; a Node keeps no time of its cordon.
    back_since: str = ""
    labels: tuple[tuple[str, str], ...] = ()  # metadata.labels, sorted
    taints: tuple[tuple[str, str, str], ...] = ()  # spec.taints: (key, value, effect)
    unschedulable: bool = False  # spec.unschedulable (cordoned)


def machine_view(node: Mapping[str, Any]) -> MachineView:
    """Reads a Node body from the API into a :class:`MachineView`."""
    conds = (node.get("status") or {}).get("conditions") or []
    ready: Mapping[str, Any] = next((c for c in conds if c.get("type") == "Ready"), {})
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    taints = (
        (str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
        for t in spec.get("taints") or []
    )
    return MachineView(
        name=meta.get("name", ""),
        ready=ready.get("status") or ConditionStatus.UNKNOWN,
        since=ready.get("lastTransitionTime") or "",
        labels=tuple(sorted((meta.get("labels") or {}).items())),
        taints=tuple(taints),
        unschedulable=bool(spec.get("unschedulable")),
    )
