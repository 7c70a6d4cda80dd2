"""Converging on the spec: the Services, the server pod and the missing node pods to create
(after the backoff), the node pods beyond ``spec.nodes`` to delete, and the phase that says so;
the policy reads the draft and returns its :class:`~.decision.Decision`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ddp_api.contract import parse_rfc3339
from ddp_api.ddpjob import DDPJobPhase, EventType, IncidentKind, Reason
from ddp_api.pods import PodPhase

from .. import diagnosis, render
from .conditions import condition
from .decision import Decision, EventNote, Outcome
from .draft import Draft, pod_names
from .groups import groups_phase
from .lost_machines import avoid_silent
from .views import MachineView, PodView

BACKOFF_CAP_S = 300.0


def backoff_s(restarts: int, base_s: float, cap_s: float = BACKOFF_CAP_S) -> float:
    """Delay before recreating after the ``restarts``-th failure: 0, base, 2x base, ... capped."""
    return 0.0 if restarts <= 1 else min(cap_s, base_s * 2 ** (restarts - 2))


def _all_present(workers: list[PodView], nodes: int) -> bool:
    """Every index below spec.nodes has a pod that is not being deleted."""
    return {x.index for x in workers if not x.deleting} >= set(range(nodes))


def converge(
    st: Draft,
    prev_phase: str,
    cfg: render.OperatorConfig,
    backoff_base_s: float,
    found: diagnosis.Diagnosis | None,
    machines: Mapping[str, MachineView],
    lost: str,
) -> Decision:
    """Creates what is missing (after any backoff; off the silent ``machines``), removes what
    is beyond spec.nodes; says what ``found`` is while pods show it, and ``lost``, what lost
    machines took now ("" none). Reads ``st`` only."""
    s = st.job.spec
    create, wait, extra, keep = _create_and_scale(st, cfg, backoff_base_s)
    create = avoid_silent(create, machines)
    creating = set(pod_names(create))
    taken = [x for x in st.foreign if x.name in creating]  # their names wait
    held = {x.name for x in taken}
    create = [o for o in create if o["kind"] != "Pod" or o["metadata"]["name"] not in held]
    events: list[EventNote] = []
    if extra:
        text = f"spec.nodes={s.nodes}: deleting {', '.join(x.name for x in extra)}"
        events.append((EventType.NORMAL, Reason.SCALING_DOWN, text))
    if pods := pod_names(create):
        events.append((EventType.NORMAL, Reason.CREATING_PODS, f"creating {', '.join(pods)}"))
    phase, reason, message = _progress_phase(st, prev_phase, wait, bool(extra))
    resized = st.status.get("observedGeneration") != st.job.metadata.get("generation")
    # torchrun restarts every worker for the new membership (PerStep: groups come and go alone)
    restarted = resized and not s.per_step
    kinds: tuple[IncidentKind, ...] = ()
    if phase == DDPJobPhase.SCALING and prev_phase == DDPJobPhase.RUNNING and restarted:
        kinds = (IncidentKind.RESIZE,)
    if found is not None:
        reason, message = found.reason, found.message
        if found.reason != st.status.get("reason"):  # one Event per problem, not per reconcile
            events.append((EventType.WARNING, found.reason, message))
    if taken and found is None:
        reason, message = names_taken(st.name, taken, reason, message)
        if reason == Reason.POD_NAME_TAKEN and reason != st.status.get("reason"):
            events.append((EventType.WARNING, reason, message))
    if lost:  # the condition names the machine
        # PerStep: the groups left go on (groups_phase said Running), the others restart.
        training = s.per_step and phase == DDPJobPhase.RUNNING
        phase = DDPJobPhase.RUNNING if training else DDPJobPhase.RESTARTING
        reason, message = Reason.NODE_LOST, lost
    return Decision(
        create=tuple(create),
        delete=tuple(extra),
        keep=keep,
        incidents=kinds,
        events=tuple(events),
        requeue_after=wait if wait > 0 else None,
        outcome=Outcome(phase, reason, message),
    )


def _create_and_scale(
    st: Draft, cfg: render.OperatorConfig, backoff_base_s: float
) -> tuple[list[dict[str, Any]], float, list[PodView], tuple[str, ...]]:
    """The Services, the store and the missing node pods to create once the backoff after the
    last failure is over, the seconds still to wait (else 0), the node pods beyond spec.nodes
    to delete (the highest indices go), and the failed pods kept while the backoff runs.

    PerStep: the backoff is the failed groups' alone. The lighthouse, in place of the store, is
    recreated at once (the groups still training need it), and so is a group that was
    disrupted, deleted or added by a scale-up; a group that failed keeps its failed pod, which
    holds its index (and shows its logs), until the backoff is over, then is recreated."""
    s, workers = st.job.spec, st.workers
    cfg = job_config(cfg, st.status)
    create = list(render.render_services(st.job))
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
        create.append(server)
    keep: tuple[str, ...] = ()
    if s.per_step and wait > 0:
        failed = (x for x in workers if x.phase == PodPhase.FAILED and not x.deleting)
        keep = tuple(x.name for x in failed if x.index < s.nodes)
    if (wait <= 0 or s.per_step) and not _finishing(st):
        create += [
            render.render_worker(st.job, i, st.restarts, cfg)
            for i in range(s.nodes)
            if i not in present
        ]
    extra = [x for x in st.running if x.index >= s.nodes]
    return create, wait, extra, keep


def _finishing(st: Draft) -> bool:
    """Training finished and a node still runs: it will exit 0 and complete the job, and a
    replacement would only wait for a rendezvous that never comes. A PerStep group needs one
    more quorum after the last step (the writer saves and marks the run complete, the others
    wait for that): with fewer than ``minGroups`` groups left it never forms, so the missing
    ones are replaced, heal at the last step and let it form."""
    s = st.job.spec
    if not st.trained() or not st.running:
        return False
    ft = s.fault_tolerance
    return ft is None or not ft.per_step or len(st.running) >= ft.groups_min


def job_config(cfg: render.OperatorConfig, status: Mapping[str, Any]) -> render.OperatorConfig:
    """The operator's settings for a job's new pods: a job whose pods ran keeps their image
    (``status.image``) where its spec names none. An operator upgraded to a new trainer image
    while a job runs would otherwise give the pods it replaces the new one: two trainer
    versions in one job (one rendezvous, one set of replica groups, one checkpoint folder). A
    job none of whose pods ran yet gets the operator's default image of the moment."""
    image = status.get("image")
    return dataclasses.replace(cfg, default_image=image) if image else cfg


def names_taken(job: str, taken: list[PodView], reason: str, message: str) -> tuple[str, str]:
    """What the job says while pods it does not control hold names of pods it would create.
    An earlier job's (controlled by another uid) or pods being deleted are waited for: the
    garbage collector deletes them. A pod that nothing controls stays until someone deletes
    it: the job says so (``PodNameTaken``) and names the fix."""
    stuck = diagnosis.in_order(x for x in taken if not x.owner and not x.deleting)
    if not stuck:
        left = diagnosis.pod_names(taken)
        return (
            reason,
            f"{message}; waiting for {left}, left by an earlier DDPJob named {job}, to go",
        )
    one = len(stuck) == 1
    it, names = ("it", "its name") if one else ("them", "their names")
    return Reason.POD_NAME_TAKEN, (
        f"{diagnosis.pod_names(stuck)} {'exists' if one else 'exist'} but no DDPJob controls"
        f" {it} (orphaned, or made by hand), and {job} needs {names}:"
        f" delete {it} (kubectl delete pod {' '.join(x.name for x in stuck)}), or give the"
        " DDPJob another name"
    )


RESTART_COUNT = "restart "  # how a Restarting message that names no cause begins


def names_a_cause(said: Mapping[str, Any]) -> bool:
    """Whether a Restarting condition says why the job restarts (an OOM kill, a start that
    failed, a stall, a worker's own words: ``j-node-0 failed with exit code 1: ValueError:
    ...``): that stays said while the job restarts, until it runs again, rather than giving
    way to a bare count (``restart 2 of backoffLimit 3``) at the next reconcile."""
    reason = said.get("reason")
    if reason in diagnosis.COUNTED_REASONS or reason == Reason.STALLED:
        return True
    message = str(said.get("message") or "")
    return reason == Reason.POD_FAILED and bool(message) and not message.startswith(RESTART_COUNT)


def _progress_phase(
    st: Draft, prev_phase: str, wait: float, scaling_down: bool
) -> tuple[DDPJobPhase, str, str]:
    """(phase, reason, message) of a job that is neither finished nor failed: Restarting after
    a failure, Running, Scaling or Pending."""
    s, workers = st.job.spec, st.workers
    running = [x for x in workers if x.index < s.nodes and x.ready and not x.deleting]
    # Messages name the target, not the live count (status.ready has it), so that a pod coming
    # up changes only counts, which the operator writes at a bounded rate.
    target = f"{s.nodes} nodes"
    groups = groups_phase(st, prev_phase, len(running), wait, scaling_down)
    if groups is not None:
        return groups
    if "lastFailureTime" in st.new or (
        prev_phase == DDPJobPhase.RESTARTING and len(running) < s.nodes
    ):
        reason: str = Reason.POD_FAILED
        message = f"{RESTART_COUNT}{st.restarts} of backoffLimit {s.backoff_limit}"
        if wait > 0:
            message += f"; recreating in {wait:.0f}s"
        if st.cause is not None:  # a failure with a diagnosis (OOMKilled) is named
            reason, message = st.cause[0], f"{st.cause[1]}; {message}"
        elif "lastFailureTime" not in st.new:  # still restarting: what was said stays
            said = condition(st.status, DDPJobPhase.RESTARTING)
            if names_a_cause(said):
                reason, message = said["reason"], said.get("message") or message
        return DDPJobPhase.RESTARTING, reason, message
    if len(running) == s.nodes and not scaling_down:
        return DDPJobPhase.RUNNING, Reason.ALL_NODES_RUNNING, f"{target} running"
    if prev_phase == DDPJobPhase.RUNNING and _all_present(workers, s.nodes) and not scaling_down:
        # A kubelet reports a finishing container not ready a moment before its pod ends:
        # no pod is coming or going, so the job is not scaling.
        return DDPJobPhase.RUNNING, Reason.NODES_NOT_READY, f"{target}, not all ready"
    if prev_phase in (DDPJobPhase.RUNNING, DDPJobPhase.SCALING):
        return DDPJobPhase.SCALING, Reason.NODES_CHANGING, f"scaling to {target}"
    return DDPJobPhase.PENDING, Reason.WAITING_FOR_NODES, f"starting {target}"
