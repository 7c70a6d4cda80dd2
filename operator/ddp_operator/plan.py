"""Pure reconciliation: (DDPJob, its pods, previous status, now) -> what to do and the new status.

No I/O: the kopf handlers observe, call :func:`plan`, and apply the result. Running it twice on
the same observation gives the same answer, so an operator restart at any point converges.

How a lost pod is counted (once per pod uid, ``status.handledFailures``, so a status written
before the pod's deletion is not counted again after an operator restart; the operator's own
deletions are recorded as handled when it makes them). A node pod that ends Failed, is deleted
by someone else while it runs, or is marked for a disruption is exactly one of:

1. a *disruption*: it carries the condition ``DisruptionTarget`` (status True), which Kubernetes
   sets on a pod it is about to take away: the eviction API (``kubectl drain``), preemption, a
   taint eviction, the pod garbage collector of a lost machine, the kubelet's node-pressure
   eviction. Counted in ``status.disruptions`` as soon as the condition is seen; recreated at
   once; never spends ``backoffLimit``.
2. a *consequence* of the last counted failure or disruption: its pod was created before it and
   fails within :data:`DISRUPTION_WINDOW_S` of it (the survivors of a lost node), or is deleted
   within :data:`SAME_DELETION_S` of it (several pods of one drain). Recreated, counted nowhere.
3. a *failure*: anything else, a non-zero exit or a deletion that says nothing about why
   (``kubectl delete pod``). Counted in ``status.restarts`` and against ``backoffLimit``. A
   recreated pod that fails again is always a failure, so a crash loop still spends the budget.

This is what a Kubernetes Job does with ``podFailurePolicy: {rules: [{action: Ignore,
onPodConditions: [{type: DisruptionTarget}]}]}``, plus rule 2, which a Job needs not: its pods
are independent, whereas one lost DDP node takes its peers' workers down with it.

Losing the rendezvous store pod costs nothing: the nodes ride it out (``ddp_trainer.node``
starts torchrun again against the new store; training resumes from the newest checkpoint), so
the operator only recreates it.

A lost machine: a node pod (or the store pod) on a Kubernetes Node whose Ready condition has
been False or Unknown for longer than ``node_lost_grace_s`` (:data:`NODE_LOST_GRACE_S`), or
whose kubelet has not renewed its Lease for that long (:func:`silent_machines`: a frozen or cut
off machine is silent at once, whereas kube-controller-manager marks it Unknown only after its
node-monitor grace period, 50 s by default), is deleted at once with grace period 0 (its
kubelet cannot confirm a graceful end) and recreated, which the scheduler places elsewhere; a
node pod lost so is a disruption. Kubernetes itself would evict it only after its
``not-ready``/``unreachable`` toleration, 300 s by default, and then leave it Terminating for
as long as the machine stays away.

The end of a job: once any node pod exits 0 (its torchrun finished training), the job is
complete. Missing node pods are not recreated and the others' failures are not counted; the
pods still running get ``completion_grace_s`` (from the first success's ``finishedAt``) to
finish, then are deleted; the job Succeeds, its message naming the nodes that did not finish.

PerStep mode (``spec.faultTolerance.mode``): each node pod is a torchft replica group and the
job's server pod is a lighthouse (``<job>-lighthouse``) instead of the store. The rules above
hold, with these differences, because one group's loss stops no other: a node pod deleted while
it runs, by anyone, is a disruption (rule 1), not a failure; no failure is the consequence of
another (rule 2 is off), so each failed pod counts; a lost lighthouse is recreated at once, even
during a backoff, and counts nothing (a ``LighthouseLost`` incident); a resize opens no
``Resize`` incident; while ``minGroups`` groups are ready the job stays Running (reason
``GroupsChanging``, or ``NodeLost``); and once rank 0 reported the last step no failure or loss
is counted and no diagnosis fails the job (it completes when a group exits 0). Nothing is ever
deleted but the pod that went: each replacement is of that one pod.

What stops a pod (an image that cannot be pulled, a missing claim, no machine that fits, a
missing command, the OOM killer) is read by :mod:`ddp_operator.diagnosis`; while pods show it,
its reason and message replace those of the phase (one Event when the reason changes), and what
cannot heal fails the job: a missing command at once, the others once a pod showing it is older
than ``spec.startupDeadlineSeconds``. An OOM kill is a failure like any other, named while the
job restarts.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ddp_api.contract import parse_rfc3339, rfc3339
from ddp_api.ddpjob import TERMINAL_PHASES, DDPJob, DDPJobPhase, DDPJobSpec, RestartPolicy
from ddp_api.metav1 import transition_time
from ddp_api.pods import selector

from . import diagnosis, incidents, queueing, render, reports

HANDLED_KEPT = 64
BACKOFF_CAP_S = 300.0
DISRUPTION_WINDOW_S = 60.0
SAME_DELETION_S = 5.0
COMPLETION_GRACE_S = 90.0  # Settings.completion_grace_s: the default
NODE_LOST_GRACE_S = 30.0  # Settings.node_lost_grace_s: the default
SILENCE_FLOOR_S = 20.0  # a machine is silent after two missed Lease renewals at the least
STALLED_S = 10.0  # the operator's own silence watch this late: it was stopped, not they
PROGRESS_DEADLINE_FLOOR_S = 600.0  # spec.progressDeadlineSeconds unset: at least this ...
STEP_TIMES_PER_DEADLINE = 10  # ... or this many of the recent step time, whichever is longer
STALLED = "Stalled"  # the reason of a restart for a job whose step stopped moving
LIGHTHOUSE_LOST = "LighthouseLost"
LIGHTHOUSE_GONE = (
    "the replica groups wait for a quorum until it answers, then go on from the step they were"
    " at: none is restarted"
)
DISRUPTION_TARGET = "DisruptionTarget"  # the pod condition Kubernetes sets before a disruption
ADMITTED = "Admitted"  # the condition of a job queued by Kueue
# The job's server pod: the rendezvous store (Restart mode) or the lighthouse (PerStep mode).
SERVER_ROLES = (render.ROLE_STORE, render.ROLE_LIGHTHOUSE)
CONTAINERS = (render.CONTAINER, render.STORE_CONTAINER, render.LIGHTHOUSE_CONTAINER)
GROUPS_CHANGING = "GroupsChanging"  # PerStep: enough groups train while others come or go


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
    problem: diagnosis.PodProblem | None = None  # what its status says stops it
    progress: reports.Record | None = None  # the progress record rank 0 wrote into it, if any

    @property
    def done(self) -> bool:
        return self.phase in TERMINAL_PHASES


def view(pod: Mapping[str, Any]) -> PodView:
    """Reads a pod body from the API into a :class:`PodView`."""
    meta, status = pod.get("metadata", {}), pod.get("status") or {}
    labels = meta.get("labels") or {}
    exit_code, reason, finished = None, "", ""
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term and cs.get("name") in CONTAINERS:
            exit_code, reason = term.get("exitCode"), term.get("reason", "")
            finished = term.get("finishedAt") or ""
    conds = {c.get("type"): c for c in status.get("conditions") or []}
    ready = (conds.get("Ready") or {}).get("status") == "True"
    target = conds.get(DISRUPTION_TARGET) or {}
    disrupted = (
        (target.get("reason") or DISRUPTION_TARGET) if target.get("status") == "True" else ""
    )
    phase = status.get("phase", "Pending")
    return PodView(
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        role=labels.get(render.LABEL_ROLE, ""),
        index=int(labels.get(render.LABEL_INDEX, "-1")),
        phase=phase,
        ready=ready and phase == "Running",
        deleting=bool(meta.get("deletionTimestamp")),
        exit_code=exit_code,
        reason=reason,
        created=meta.get("creationTimestamp") or "",
        account=(pod.get("spec") or {}).get("serviceAccountName") or "",
        finished=finished,
        disrupted=disrupted,
        machine=(pod.get("spec") or {}).get("nodeName") or "",
        problem=diagnosis.read(pod),
        progress=reports.record_of_pod(pod),
    )


@dataclass(frozen=True)
class MachineView:
    """What the planner needs to know of one Kubernetes Node: its Ready condition."""

    name: str
    ready: str  # True, False or Unknown
    since: str  # the Ready condition's lastTransitionTime (RFC 3339)
    # Set by the controller once the machine's kubelet has renewed its Lease for no less than
    # the grace period: when the operator last saw it renewed (RFC 3339, the operator's clock).
    silent_since: str = ""


def machine_view(node: Mapping[str, Any]) -> MachineView:
    """Reads a Node body from the API into a :class:`MachineView`."""
    conds = (node.get("status") or {}).get("conditions") or []
    ready: Mapping[str, Any] = next((c for c in conds if c.get("type") == "Ready"), {})
    return MachineView(
        name=(node.get("metadata") or {}).get("name", ""),
        ready=ready.get("status") or "Unknown",
        since=ready.get("lastTransitionTime") or "",
    )


@dataclass
class Plan:
    """What to do: objects to create (unless present), pods to delete, the status to write."""

    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)  # pod names
    force: list[str] = field(default_factory=list)  # pod names to delete with grace period 0
    status: dict[str, Any] = field(default_factory=dict)  # merge patch of .status
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, text)
    delete_job: bool = False
    requeue_after: float | None = None
    closed: list[dict[str, Any]] = field(default_factory=list)  # incidents a report closed

    def warn(self, reason: str, text: str) -> None:
        self.events.append(("Warning", reason, text))

    def info(self, reason: str, text: str) -> None:
        self.events.append(("Normal", reason, text))

    def requeue(self, seconds: float) -> None:
        seconds = max(seconds, 0.1)
        self.requeue_after = (
            seconds if self.requeue_after is None else min(self.requeue_after, seconds)
        )

    def created_pods(self) -> list[str]:
        return [o["metadata"]["name"] for o in self.create if o["kind"] == "Pod"]


def backoff_s(restarts: int, base_s: float, cap_s: float = BACKOFF_CAP_S) -> float:
    """Delay before recreating after the ``restarts``-th failure: 0, base, 2x base, ... capped."""
    return 0.0 if restarts <= 1 else min(cap_s, base_s * 2 ** (restarts - 2))


def is_permanent(policy: str, exit_code: int | None) -> bool:
    """Whether a failed pod fails the job instead of being recreated."""
    if policy == RestartPolicy.NEVER:
        return True
    if policy == RestartPolicy.EXIT_CODE:
        # 1-127: the program chose to fail; 128+: killed by a signal (preemption, OOM).
        return exit_code is not None and 1 <= exit_code <= 127
    return False


def conditions(
    previous: Iterable[Mapping[str, Any]], phase: str, reason: str, message: str, now: str
) -> list[dict[str, Any]]:
    """One condition per phase the job has been in; only the current one is True
    (``lastTransitionTime``: :func:`ddp_api.metav1.transition_time`)."""
    by_type = {c["type"]: dict(c) for c in previous}
    by_type.setdefault(phase, {"type": phase, "status": "False"})
    out = []
    for ctype, c in by_type.items():
        status = "True" if ctype == phase else "False"
        c["lastTransitionTime"] = transition_time(c, status, now)
        c["status"] = status
        if ctype == phase:
            c["reason"], c["message"] = reason, message
        out.append(c)
    return out


@dataclass
class _State:
    """The working state of one :func:`plan` call."""

    job: DDPJob
    status: Mapping[str, Any]
    pods: list[PodView]
    now: dt.datetime
    pending: set[str] = field(default_factory=set)
    plan: Plan = field(default_factory=Plan)
    new: dict[str, Any] = field(default_factory=dict)
    handled: list[str] = field(default_factory=list)
    restarts: int = 0
    admitted: dict[str, Any] | None = None  # the Admitted condition, for a job Kueue queues
    cause: tuple[str, str] | None = None  # (reason, message) of a failure counted now

    @property
    def name(self) -> str:
        return render.job_key(self.job)[1]

    @property
    def workers(self) -> list[PodView]:
        return sorted((x for x in self.pods if x.role == render.ROLE_WORKER), key=lambda x: x.index)

    @property
    def live(self) -> list[PodView]:
        return [x for x in self.pods if not x.deleting]

    def delete(self, pods: Iterable[PodView]) -> None:
        """Our own deletions: recorded as handled so they never count as failures."""
        for x in pods:
            if x.name not in self.plan.delete:
                self.plan.delete.append(x.name)
            if x.uid not in self.handled:
                self.handled.append(x.uid)

    def finish(self, phase: DDPJobPhase, reason: str, message: str) -> Plan:
        """Ends the job: stops what still runs (finished worker pods stay, for their logs)."""
        self.delete(x for x in self.live if not x.done or x.role != render.ROLE_WORKER)
        self.new["completionTime"] = rfc3339(self.now)
        (self.plan.info if phase == DDPJobPhase.SUCCEEDED else self.plan.warn)(reason, message)
        return self.result(phase, reason, message)

    def result(self, phase: str | None, reason: str = "", message: str = "") -> Plan:
        """The plan with its status: ``phase`` None keeps the previous phase and conditions."""
        new, desired = self.new, self.job.spec.nodes
        if phase is not None:
            new["phase"], new["reason"] = phase, reason
            previous = self.status.get("conditions") or []
            if self.admitted is None:
                new["conditions"] = conditions(previous, phase, reason, message, rfc3339(self.now))
            else:  # Admitted sits beside the one-per-phase conditions
                kept = [c for c in previous if c.get("type") != ADMITTED]
                new["conditions"] = conditions(kept, phase, reason, message, rfc3339(self.now))
                old: dict[str, Any] = next((c for c in previous if c.get("type") == ADMITTED), {})
                cond = {**old, **self.admitted}
                cond["lastTransitionTime"] = transition_time(old, cond["status"], rfc3339(self.now))
                new["conditions"].append(cond)
        alive = [x for x in self.workers if not x.deleting and not x.done]
        ready = [x for x in alive if x.ready]
        new["nodes"] = len(alive)
        new["readyNodes"] = len(ready)
        new["ready"] = f"{len(ready)}/{desired}"
        new["restarts"] = self.restarts
        new["handledFailures"] = self.handled[-HANDLED_KEPT:]
        world = (self.new.get("progress") or self.status.get("progress") or {}).get("worldSize")
        if world:
            new["worldSize"] = world
        self.plan.status = new
        return self.plan


def plan(
    job: DDPJob,
    status: Mapping[str, Any],
    pods: Iterable[PodView],
    now: dt.datetime,
    cfg: render.OperatorConfig,
    backoff_base_s: float = 10.0,
    pending: Collection[str] = (),
    admission: queueing.Admission | None = None,
    progress: Mapping[str, Any] | None = None,
    completion_grace_s: float = COMPLETION_GRACE_S,
    machines: Mapping[str, MachineView] | None = None,
    node_lost_grace_s: float = NODE_LOST_GRACE_S,
) -> Plan:
    """Decides what to do for one observation of a job; see the module docstring.

    ``pending`` names pods created moments ago that the watch has not shown yet; ``admission``
    is Kueue's decision for a job in a Kueue queue (None: not queued, run as usual);
    ``progress`` is rank 0's newest valid report (:func:`ddp_operator.reports.parse`), copied
    into ``status.progress`` with the time it estimates is left
    (:func:`ddp_operator.reports.remaining_seconds`) when it differs.
    ``completion_grace_s`` is how long the other nodes get once one has finished training;
    ``machines`` are the cluster's Nodes by name (None: not known), whose pods are deleted at
    once when ``node_lost_grace_s`` have passed since they stopped being Ready.
    """
    st = _State(job, status, list(pods), now, pending=set(pending))
    st.handled = list(status.get("handledFailures") or [])
    st.restarts = int(status.get("restarts") or 0)
    st.new = {"observedGeneration": job.metadata.get("generation"), "selector": ""}
    st.new["selector"] = selector(st.name)
    if progress is not None:
        shown = status.get("progress")
        progress = {**progress, reports.ETA: reports.remaining_seconds(shown, progress)}
        if reports.without_unset(progress) != reports.without_unset(shown):
            st.new["progress"] = progress  # None values: fields the merge patch removes
        fresh = progress.get("updatedAt") != (shown or {}).get("updatedAt")  # a new report
        moved = progress.get("step") != (shown or {}).get("step")
        if moved or (fresh and not _stepped_since_running(status)):
            st.new["lastStepTime"] = rfc3339(now)  # the progress deadline counts from here
        if fresh:
            changes, st.plan.closed = incidents.account(status, shown, progress)
            st.new.update(changes)
    prev_phase = status.get("phase") or ""

    if prev_phase in TERMINAL_PHASES:
        return _finished(st, prev_phase)
    if job.spec.suspend:
        if admission is not None and admission.state != queueing.State.ADMITTED:
            st.new["clusterQueue"] = None  # Kueue took the quota back (Workload inactive)
        return _suspended(st, prev_phase)
    if admission is not None:
        st.new["queue"] = admission.queue
        if admission.state != queueing.State.ADMITTED:
            return _queued(st, prev_phase, admission)
        st.job = job = queueing.admitted_job(job, admission)
        _admitted(st, admission)
    if prev_phase == DDPJobPhase.SUSPENDED:
        st.plan.info("Resumed", "spec.suspend is false: recreating pods, resuming from checkpoint")

    late = _past_deadline(st, status)
    if late is not None:
        return late
    lost = _lost_machines(st, machines or {}, node_lost_grace_s)
    done = _completion(st, completion_grace_s)
    if done is not None:
        return done
    failed = _failures(st)
    if failed is not None:
        return failed
    stalled_ = _stalled(st, prev_phase)
    if stalled_ is not None:
        return stalled_
    found = _diagnosed(st)
    if found is not None and found.fails_in is not None:
        if found.fails_in > 0:
            st.plan.requeue(found.fails_in)
        elif not (job.spec.per_step and _trained(st)):  # PerStep: a group will exit 0
            return st.finish(DDPJobPhase.FAILED, found.reason, found.failed)
    converged = _converge(st, prev_phase, cfg, backoff_base_s, found)
    _avoid_silent(st.plan.create, machines or {})
    if lost:  # the condition names the machine; _converge saw the pod still there
        # PerStep: the groups left go on (_groups_phase said Running), the others restart.
        training = job.spec.per_step and converged.status.get("phase") == DDPJobPhase.RUNNING
        phase = DDPJobPhase.RUNNING if training else DDPJobPhase.RESTARTING
        return st.result(phase, "NodeLost", lost)
    return converged


def _past_deadline(st: _State, status: Mapping[str, Any]) -> Plan | None:
    """Sets ``startTime`` on the first reconcile; the job Failed once it has run longer than
    ``activeDeadlineSeconds``, else a reconcile is due when it would."""
    start = parse_rfc3339(status.get("startTime"))
    if start is None:
        start = st.now
        st.new["startTime"] = rfc3339(st.now)
    deadline = st.job.spec.active_deadline_seconds
    if deadline is None:
        return None
    left = (start - st.now).total_seconds() + deadline
    if left <= 0:
        return st.finish(
            DDPJobPhase.FAILED,
            "DeadlineExceeded",
            f"the job ran longer than activeDeadlineSeconds={deadline}",
        )
    st.plan.requeue(left)
    return None


def _diagnosed(st: _State) -> diagnosis.Diagnosis | None:
    """The running pods' problem that the job shows (:mod:`~ddp_operator.diagnosis`); a
    reconcile is due when what they show may have settled."""
    alive = [x for x in st.live if not x.done]
    settled = diagnosis.settled_in(alive, st.job.spec, st.now)
    if settled is not None:
        st.plan.requeue(settled)
    return diagnosis.diagnose(alive, st.job.spec, st.now)


def _finished(st: _State, prev_phase: str) -> Plan:
    """A Succeeded or Failed job: free what still runs, delete the job when its TTL is due."""
    st.delete(x for x in st.live if not x.done or x.role != render.ROLE_WORKER)
    ttl = st.job.spec.ttl_seconds_after_finished
    if ttl is not None:
        done_at = parse_rfc3339(st.status.get("completionTime")) or st.now
        left = (done_at - st.now).total_seconds() + ttl
        if left <= 0:
            st.plan.delete_job = True
            st.plan.info(
                "TTLExpired",
                f"deleting {st.name}: it finished {prev_phase} more than {ttl}s ago"
                " (ttlSecondsAfterFinished)",
            )
        else:
            st.plan.requeue(left)
    return st.result(None)


def _suspended(st: _State, prev_phase: str) -> Plan:
    live = st.live
    st.delete(live)
    if prev_phase != DDPJobPhase.SUSPENDED:
        st.plan.info(
            "Suspended",
            f"spec.suspend is true: deleting {len(live)} pods; the checkpoints are kept and"
            " training resumes from them when spec.suspend is false again",
        )
    st.new["startTime"] = None  # activeDeadlineSeconds counts time since the last resume
    return st.result(DDPJobPhase.SUSPENDED, "Suspended", "spec.suspend is true")


def _queued(st: _State, prev_phase: str, adm: queueing.Admission) -> Plan:
    """Not admitted by Kueue (yet, or again after an eviction): no pods."""
    live = st.live
    st.delete(live)
    reason = adm.reason or adm.state.value
    if adm.state == queueing.State.EVICTED:
        cq = st.status.get("clusterQueue")
        if cq:  # the first reconcile that sees this eviction
            st.plan.warn(
                "Evicted",
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
            st.plan.info("Queued", f"waiting for Kueue to admit it from LocalQueue {adm.queue}")
        message = f"waiting in LocalQueue {adm.queue}: {adm.message}"
    st.admitted = {"type": ADMITTED, "status": "False", "reason": reason, "message": message}
    st.new["clusterQueue"] = None
    st.new["startTime"] = None  # activeDeadlineSeconds counts time since the last admission
    return st.result(DDPJobPhase.QUEUED, reason, message)


def _admitted(st: _State, adm: queueing.Admission) -> None:
    """Admitted by Kueue: an Event the first time this admission is seen."""
    cq = adm.cluster_queue
    nodes = st.job.spec.nodes
    flavors = f" on flavor {', '.join(adm.flavors)}" if adm.flavors else ""
    message = f"admitted by ClusterQueue {cq}: {nodes} nodes{flavors}"
    st.admitted = {
        "type": ADMITTED,
        "status": "True",
        "reason": adm.reason or ADMITTED,
        "message": message,
    }
    if st.status.get("clusterQueue") == cq:
        return
    n = int(st.status.get("admissions") or 0) + 1
    st.new["admissions"] = n
    st.new["clusterQueue"] = cq
    if n == 1:
        st.plan.info("Admitted", f"Kueue {message} ({adm.reason}: {adm.message})")
    else:
        st.plan.info(
            "Readmitted",
            f"Kueue {message} ({adm.reason}: {adm.message}); admission {n}: training resumes"
            " from the newest checkpoint",
        )


def _completion(st: _State, grace_s: float) -> Plan | None:
    """Once a node's torchrun exited 0 training is complete (module docstring): None before."""
    workers = st.workers
    succeeded = [x for x in workers if x.phase == "Succeeded"]
    if not succeeded:
        return None
    first = min(
        succeeded, key=lambda x: (parse_rfc3339(x.finished or x.created) or st.now, x.index)
    )
    known = set(st.handled)
    nodes = st.job.spec.nodes
    lost = [
        x
        for x in workers
        if x.index < nodes and (x.phase == "Failed" or (x.deleting and not x.done))
    ]
    for x in lost:  # not failures: the job is complete; recorded so they never count later
        if x.uid not in st.handled:
            st.handled.append(x.uid)
    running = [x for x in workers if not x.done and not x.deleting]
    done_at = parse_rfc3339(first.finished or first.created) or st.now
    left = (done_at - st.now).total_seconds() + grace_s
    if running and left > 0:
        st.plan.requeue(left)
        names = ", ".join(x.name for x in running)
        return st.result(
            DDPJobPhase.RUNNING,
            "NodesCompleting",
            f"{first.name} completed training; waiting up to {left:.0f}s more for {names}",
        )
    if _completing(st.status):  # whatever went since the first success was seen went after it
        known = set()
    message = completion_message(st.name, first, lost, running, known, nodes, succeeded, grace_s)
    return st.finish(DDPJobPhase.SUCCEEDED, "Completed", message)


def _completing(status: Mapping[str, Any]) -> bool:
    """Whether the last plan saw a node finished and waited for the rest."""
    return any(
        c.get("reason") == "NodesCompleting" and c.get("status") == "True"
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


def follows_disruption(
    pod: PodView, failed: bool, last_counted: dt.datetime | None, now: dt.datetime
) -> bool:
    """Whether ``pod``'s failure (``failed``) or deletion is part of the disruption counted at
    ``last_counted``: the pod is older than it, and it came within the window (module docs)."""
    created = parse_rfc3339(pod.created)
    window = DISRUPTION_WINDOW_S if failed else SAME_DELETION_S
    return (
        last_counted is not None
        and created is not None
        and created < last_counted
        and (now - last_counted).total_seconds() <= window
    )


def _new_failures(st: _State) -> list[tuple[PodView, bool]]:
    """(pod, failed: else deleted while running or marked for a disruption) not counted yet, a
    disrupted or deleted pod first: it is the likelier cause of what failed with it, and the
    one an Event names."""
    nodes = st.job.spec.nodes
    new: list[tuple[PodView, bool]] = []
    for x in st.pods:
        in_job = x.role in SERVER_ROLES or 0 <= x.index < nodes
        failed = x.phase == "Failed" and not x.deleting
        # DisruptionTarget is set before the pod goes: counted when seen, even before deletion.
        disrupted = in_job and not x.done and (x.deleting or bool(x.disrupted))
        if x.uid in st.handled:
            if failed:
                st.delete([x])  # counted before; its deletion did not happen yet
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
    return new


def _what(
    x: PodView, failed: bool, spec: DDPJobSpec, found: diagnosis.Finding | None = None
) -> str:
    if x.disrupted:
        return f"was disrupted ({DISRUPTION_TARGET}: {x.disrupted})"
    if not failed:
        return "was deleted while running"
    code = "" if x.exit_code is None else f" (exit code {x.exit_code})"
    if found is not None and found.reason == diagnosis.OOM:
        return f"failed{code}: {diagnosis.message(found, [x])}"
    if found is not None and x.problem is not None:
        return f"could not start{code}: {x.problem.reason}: {x.problem.message}"
    if x.exit_code is not None:
        return f"failed with exit code {x.exit_code}{diagnosis.killed_hint(x, spec)}"
    return f"failed ({x.reason or 'no exit code'})"


def _incident(st: _State, kind: str) -> None:
    """Opens an incident of ``kind`` (:mod:`ddp_operator.incidents`)."""
    st.new["incidents"] = incidents.open_incident(st.status, st.new, kind, rfc3339(st.now))


def _count_disruption(st: _State, kind: str = "Disruption") -> int:
    """One more disruption in the status, and its incident; returns how many there have been."""
    _incident(st, kind)
    n = int(st.new.get("disruptions") or st.status.get("disruptions") or 0) + 1
    st.new["disruptions"] = n
    st.new["lastDisruptionTime"] = rfc3339(st.now)
    return n


def silent_machines(heard: Mapping[str, float], now: float, grace_s: float) -> set[str]:
    """The machines whose heartbeat (kubelet's Lease in kube-node-lease, renewed every 10 s by
    default) was last seen ``grace_s`` (at least :data:`SILENCE_FLOOR_S`) or more before
    ``now``, both on the operator's monotonic clock: a machine's own clock is never compared
    with ours."""
    after = max(grace_s, SILENCE_FLOOR_S)
    return {name for name, at in heard.items() if now - at >= after}


def stalled(last: float, now: float, tick_s: float) -> bool:
    """Whether a tick due ``tick_s`` after ``last`` came :data:`STALLED_S` late or more: the
    operator's own process was stopped (its machine frozen) and has heard nothing meanwhile."""
    return now - last - tick_s >= STALLED_S


def _gone(m: MachineView, now: dt.datetime) -> tuple[float, str]:
    """For how long a machine has been lost, and how that shows; (0, "") while it is not."""
    if m.silent_since:
        silent_s = (now - (parse_rfc3339(m.silent_since) or now)).total_seconds()
        return silent_s, f"which has sent no heartbeat (its Lease) for {silent_s:.0f}s"
    if m.ready == "True":
        return 0.0, ""
    gone_s = (now - (parse_rfc3339(m.since) or now)).total_seconds()
    return gone_s, f"whose Ready condition has been {m.ready} for {gone_s:.0f}s"


def _avoid_silent(create: list[dict[str, Any]], machines: Mapping[str, MachineView]) -> None:
    """New pods must not land on a silent machine: its Node still says Ready (and has no
    taint) until kube-controller-manager's grace runs out, so the scheduler would pick it. A
    required node affinity term ``kubernetes.io/hostname NotIn`` them is added to every term of
    the pod's own (terms are ORed, expressions within one ANDed)."""
    silent = sorted(n for n, m in machines.items() if m.silent_since)
    if not silent:
        return
    avoid = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": silent}
    for obj in create:
        if obj.get("kind") != "Pod":
            continue
        spec = obj.setdefault("spec", {})
        node = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
        required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
        terms = required.setdefault("nodeSelectorTerms", []) or [{}]
        required["nodeSelectorTerms"] = [
            {**t, "matchExpressions": [*(t.get("matchExpressions") or []), avoid]} for t in terms
        ]


def _lost_machines(st: _State, machines: Mapping[str, MachineView], grace_s: float) -> str:
    """Deletes at once (grace 0) the pods on machines not Ready, or silent, for longer than
    ``grace_s`` (module docstring); returns what happened, for the condition ("" when nothing
    did)."""
    said = []
    for x in st.pods:
        m = machines.get(x.machine) if x.machine else None
        if m is None or x.done:
            continue
        gone_s, how = _gone(m, st.now)
        if not how:
            continue
        if gone_s < grace_s:
            st.plan.requeue(grace_s - gone_s)
            continue
        if x.uid in st.handled:  # counted, or deleted by the operator: stuck Terminating there
            if x.deleting:
                st.plan.force.append(x.name)
            continue
        st.handled.append(x.uid)
        st.plan.force.append(x.name)
        what = (
            f"{x.name} was on machine {m.name}, {how} (more than {grace_s:.0f}s):"
            " deleted at once, recreated elsewhere"
        )
        if x.role == render.ROLE_STORE:
            _incident(st, "StoreLost")
            st.plan.warn("StoreLost", f"{what} (no restart counted)")
        elif x.role == render.ROLE_LIGHTHOUSE:
            _incident(st, LIGHTHOUSE_LOST)
            st.plan.warn(LIGHTHOUSE_LOST, f"{what} (no restart counted; {LIGHTHOUSE_GONE})")
        elif st.job.spec.per_step:
            n = _count_disruption(st, "NodeLost")
            st.plan.warn(
                "NodeLost",
                f"{what}, alone: the other replica groups keep training (disruption {n}; not"
                " against backoffLimit)",
            )
        else:
            n = _count_disruption(st, "NodeLost")
            st.plan.warn("NodeLost", f"{what} (disruption {n}; not against backoffLimit)")
        said.append(what)
    return "; ".join(said)


def last_counted(status: Mapping[str, Any]) -> dt.datetime | None:
    """When the last failure or disruption was counted: what later losses may follow."""
    stamps = [parse_rfc3339(status.get(k)) for k in ("lastFailureTime", "lastDisruptionTime")]
    return max((t for t in stamps if t is not None), default=None)


def _failures(st: _State) -> Plan | None:
    """Counts each new disruption, and each failure that follows none (module docstring);
    returns the final plan when one fails the job."""
    s = st.job.spec
    last = last_counted(st.status)
    for x, failed in _new_failures(st):
        st.handled.append(x.uid)
        worker = x.role == render.ROLE_WORKER
        if worker and s.per_step and _trained(st):  # training finished: the job cannot fail
            if failed:
                st.delete([x])
            st.plan.info(
                "LostAfterTraining",
                f"{x.name} {_what(x, failed, s)} after training reached its last step: not"
                " counted (the job completes once a replica group exits 0)",
            )
            continue
        found = diagnosis.finding(x, s) if failed and not x.disrupted else None
        if found is not None and found.outcome == diagnosis.Effect.FAILS:
            return st.finish(DDPJobPhase.FAILED, found.reason, diagnosis.message(found, [x]))
        what = _what(x, failed, s, found)
        if found is not None and found.outcome == diagnosis.Effect.COUNTED:
            st.cause = (found.reason, f"{x.name} {what}")
        # PerStep: a pod deleted while it runs took nothing down with it, whoever deleted it.
        if worker and (x.disrupted or (s.per_step and not failed)):
            if failed:
                st.delete([x])
            disruptions = _count_disruption(st)
            last = st.now
            alone = (
                "replacing it alone: the other replica groups keep training"
                if s.per_step
                else "recreating it"
            )
            st.plan.warn(
                "Disruption",
                f"{x.name} {what}; {alone} (disruption {disruptions}; disruptions do not"
                f" count against backoffLimit {s.backoff_limit})",
            )
            continue
        if failed and x.role == render.ROLE_WORKER and is_permanent(s.restart_policy, x.exit_code):
            return st.finish(
                DDPJobPhase.FAILED,
                "PodFailed",
                f"{x.name} {what}; restartPolicy {s.restart_policy.value} treats it as permanent",
            )
        if failed:
            st.delete([x])
        if x.role == render.ROLE_STORE:
            _incident(st, "StoreLost")
            st.plan.warn(
                "StoreLost",
                f"{x.name} {what}; recreating it: the nodes wait for the new store, rendezvous"
                " again and resume from the newest checkpoint (no restart counted)",
            )
            continue
        if x.role == render.ROLE_LIGHTHOUSE:
            _incident(st, LIGHTHOUSE_LOST)
            st.plan.warn(
                LIGHTHOUSE_LOST,
                f"{x.name} {what}; recreating it (no restart counted; {LIGHTHOUSE_GONE})",
            )
            continue
        # PerStep: groups fail alone (a survivor never dies because a peer did), so no failure
        # is another's consequence.
        if not s.per_step and follows_disruption(x, failed, last, st.now):
            continue  # counted with the failure or disruption that began this
        st.restarts += 1
        last = st.now
        st.new["lastFailureTime"] = rfc3339(st.now)
        _incident(st, "Failure")
        if st.restarts > s.backoff_limit:
            return st.finish(
                DDPJobPhase.FAILED,
                "BackoffLimitExceeded",
                f"{x.name} {what}; the job already used its backoffLimit of"
                f" {s.backoff_limit} restarts",
            )
        st.plan.warn(
            "PodFailed" if failed else "PodDisrupted",
            f"{x.name} {what}; recreating it (restart {st.restarts} of backoffLimit"
            f" {s.backoff_limit}; failures of older pods within {DISRUPTION_WINDOW_S:.0f}s"
            " count with this one)",
        )
    return None


def progress_deadline_s(spec_s: int | None, progress: Mapping[str, Any] | None) -> float:
    """How long a Running job may go without a step (0: no limit): ``spec_s`` when set, else
    :data:`PROGRESS_DEADLINE_FLOOR_S` or :data:`STEP_TIMES_PER_DEADLINE` step times, the step
    time read from the time left for the steps left (the pace of the last two reports)."""
    if spec_s is not None:
        return float(spec_s)
    return max(PROGRESS_DEADLINE_FLOOR_S, STEP_TIMES_PER_DEADLINE * reports.step_seconds(progress))


def _stepped_since_running(status: Mapping[str, Any]) -> bool:
    """Whether a report came (``lastStepTime``) since the job last became Running."""
    last = parse_rfc3339(status.get("lastStepTime"))
    running = parse_rfc3339(_condition(status, DDPJobPhase.RUNNING).get("lastTransitionTime"))
    return last is not None and (running is None or last >= running)


def _stalled(st: _State, prev_phase: str) -> Plan | None:
    """Restarts a job that was Running with every node ready and whose step has not moved for
    its progress deadline (:func:`progress_deadline_s`), counted from rank 0's last report of a
    new step (or its first report since the job became Running): every node pod is deleted
    (the store stays) and recreated. Until a report comes after the job became Running, it is
    starting (loading data, compiling), not stalled. The first stall at a step is a disruption;
    another at the same step (it hangs where it hung) is a failure, against backoffLimit. Not
    while held or after the last step."""
    s = st.job.spec
    progress = st.new.get("progress") or st.status.get("progress")
    deadline = progress_deadline_s(s.progress_deadline_seconds, progress)
    if not deadline or prev_phase != DDPJobPhase.RUNNING:
        return None
    # PerStep: the groups ready train without the others, so they may stall without them.
    ft = s.fault_tolerance if s.per_step else None
    if st.status.get("reason") not in ("AllNodesRunning", *([GROUPS_CHANGING] if ft else [])):
        return None
    p = progress or {}
    step, total = p.get("step"), p.get("totalSteps")
    if p.get("heldAtStep") is not None or (
        step is not None and total is not None and step >= total
    ):
        return None
    workers = [x for x in st.workers if not x.deleting and not x.done]
    if len([x for x in workers if x.ready and x.index < s.nodes]) < (
        ft.groups_min if ft else s.nodes
    ):
        return None
    seen = {**st.status, "lastStepTime": st.new.get("lastStepTime", st.status.get("lastStepTime"))}
    if not _stepped_since_running(seen):
        return None
    since = parse_rfc3339(seen["lastStepTime"])
    assert since is not None  # _stepped_since_running said so
    quiet_s = (st.now - since).total_seconds()
    if quiet_s < deadline:
        st.plan.requeue(deadline - quiet_s)
        return None
    st.delete(workers)
    at = "before the first step" if step is None else f"at step {step}"
    setting = "progressDeadlineSeconds" + (
        " (default)" if s.progress_deadline_seconds is None else ""
    )
    what = (
        f"no training step for {quiet_s:.0f}s {at} ({setting} {deadline:.0f}): deleting the"
        " node pods and recreating them"
    )
    if render.reports_progress(st.job):  # the bundled trainer's workers (ddp_trainer.stacks)
        what += " (each worker wrote every thread's stack to its log)"
    again = step is not None and st.status.get("stalledAtStep") == step
    st.new["stalledAtStep"] = step
    if not again:
        n = _count_disruption(st, STALLED)
        message = f"{what}; disruption {n}, not against backoffLimit (a second stall here is)"
        st.plan.warn(STALLED, message)
        return st.result(DDPJobPhase.RESTARTING, STALLED, message)
    st.restarts += 1
    st.new["lastFailureTime"] = rfc3339(st.now)
    _incident(st, STALLED)
    if st.restarts > s.backoff_limit:
        return st.finish(
            DDPJobPhase.FAILED,
            STALLED,
            f"{what}; stalled at this step before, and the job already used its backoffLimit"
            f" of {s.backoff_limit} restarts",
        )
    message = f"{what}; stalled at this step before: restart {st.restarts} of backoffLimit"
    message += f" {s.backoff_limit}"
    st.plan.warn(STALLED, message)
    return st.result(DDPJobPhase.RESTARTING, STALLED, message)


def _all_present(workers: list[PodView], nodes: int) -> bool:
    """Every index below spec.nodes has a pod that is not being deleted."""
    return {x.index for x in workers if not x.deleting} >= set(range(nodes))


def _converge(
    st: _State,
    prev_phase: str,
    cfg: render.OperatorConfig,
    backoff_base_s: float,
    found: diagnosis.Diagnosis | None,
) -> Plan:
    """Creates what is missing (after any backoff), removes what is beyond spec.nodes; says
    what ``found`` is while pods show it."""
    wait, extra = _create_and_scale(st, cfg, backoff_base_s)
    phase, reason, message = _progress_phase(st, prev_phase, wait, bool(extra))
    resized = st.status.get("observedGeneration") != st.job.metadata.get("generation")
    # torchrun restarts every worker for the new membership (PerStep: groups come and go alone)
    restarted = resized and not st.job.spec.per_step
    if phase == DDPJobPhase.SCALING and prev_phase == DDPJobPhase.RUNNING and restarted:
        _incident(st, "Resize")
    if found is not None:
        reason, message = found.reason, found.message
        if found.reason != st.status.get("reason"):  # one Event per problem, not per reconcile
            st.plan.warn(found.reason, message)
    return st.result(phase, reason, message)


def _create_and_scale(
    st: _State, cfg: render.OperatorConfig, backoff_base_s: float
) -> tuple[float, list[PodView]]:
    """The Services, the store and the missing node pods to create once the backoff after the
    last failure is over (seconds still to wait, else 0), and the node pods beyond spec.nodes
    to delete (the highest indices go). A PerStep job's lighthouse, in place of the store, is
    recreated at once, backoff or not: the groups still training need it."""
    s, p, workers = st.job.spec, st.plan, st.workers
    p.create += render.render_services(st.job)
    last_failure = parse_rfc3339(st.new.get("lastFailureTime") or st.status.get("lastFailureTime"))
    wait = 0.0
    if last_failure is not None:
        wait = (last_failure - st.now).total_seconds() + backoff_s(st.restarts, backoff_base_s)
    # A pod being deleted keeps its name until it is gone: its successor waits for that.
    present = {x.index for x in workers}
    present |= {i for i in range(s.nodes) if render.worker_name(st.name, i) in st.pending}
    server, role = (
        (render.render_lighthouse(st.job, cfg), render.ROLE_LIGHTHOUSE)
        if s.per_step
        else (render.render_store(st.job, cfg), render.ROLE_STORE)
    )
    has_server = server["metadata"]["name"] in st.pending or any(x.role == role for x in st.pods)
    if not has_server and (wait <= 0 or s.per_step):  # PerStep: the live groups need it now
        p.create.append(server)
    if wait > 0:
        p.requeue(wait)
    else:
        for i in range(s.nodes):
            if i not in present:
                p.create.append(render.render_worker(st.job, i, st.restarts, cfg))
    extra = [x for x in workers if x.index >= s.nodes and not x.deleting and not x.done]
    if extra:
        st.delete(extra)
        p.info("ScalingDown", f"spec.nodes={s.nodes}: deleting {', '.join(x.name for x in extra)}")
    if p.created_pods():
        p.info("CreatingPods", f"creating {', '.join(p.created_pods())}")
    return wait, extra


def _progress_phase(
    st: _State, prev_phase: str, wait: float, scaling_down: bool
) -> tuple[str, str, str]:
    """(phase, reason, message) of a job that is neither finished nor failed: Restarting after
    a failure, Running, Scaling or Pending."""
    s, workers = st.job.spec, st.workers
    running = [x for x in workers if x.index < s.nodes and x.ready and not x.deleting]
    # Messages name the target, not the live count (status.ready has it), so that a pod coming
    # up changes only counts, which the operator writes at a bounded rate.
    target = f"{s.nodes} nodes"
    groups = _groups_phase(st, prev_phase, len(running), wait, scaling_down)
    if groups is not None:
        return groups
    if "lastFailureTime" in st.new or (
        prev_phase == DDPJobPhase.RESTARTING and len(running) < s.nodes
    ):
        reason = "PodFailed"
        message = f"restart {st.restarts} of backoffLimit {s.backoff_limit}"
        if wait > 0:
            message += f"; recreating in {wait:.0f}s"
        if st.cause is not None:  # a failure with a diagnosis (OOMKilled) is named
            reason, message = st.cause[0], f"{st.cause[1]}; {message}"
        elif "lastFailureTime" not in st.new:  # still restarting: what was said stays
            said = _condition(st.status, DDPJobPhase.RESTARTING)
            if said.get("reason") in diagnosis.COUNTED_REASONS or said.get("reason") == STALLED:
                reason, message = said["reason"], said.get("message") or message
        return DDPJobPhase.RESTARTING, reason, message
    if len(running) == s.nodes and not scaling_down:
        return DDPJobPhase.RUNNING, "AllNodesRunning", f"{target} running"
    if prev_phase == DDPJobPhase.RUNNING and _all_present(workers, s.nodes) and not scaling_down:
        # A kubelet reports a finishing container not ready a moment before its pod ends:
        # no pod is coming or going, so the job is not scaling.
        return DDPJobPhase.RUNNING, "NodesNotReady", f"{target}, not all ready"
    if prev_phase in (DDPJobPhase.RUNNING, DDPJobPhase.SCALING):
        return DDPJobPhase.SCALING, "NodesChanging", f"scaling to {target}"
    return DDPJobPhase.PENDING, "WaitingForNodes", f"starting {target}"


def _groups_phase(
    st: _State, prev_phase: str, running: int, wait: float, scaling_down: bool
) -> tuple[str, str, str] | None:
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
    return DDPJobPhase.RUNNING, GROUPS_CHANGING, message


def _trained(st: _State) -> bool:
    """Whether rank 0 reported the last step (status.progress.step at totalSteps)."""
    p = st.new.get("progress") or st.status.get("progress") or {}
    step, total = p.get("step"), p.get("totalSteps")
    return step is not None and total is not None and step >= total


def _condition(status: Mapping[str, Any], ctype: str) -> Mapping[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == ctype), {})
