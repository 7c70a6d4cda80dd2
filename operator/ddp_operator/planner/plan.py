"""The planner's entry: one observation of a job in, one :class:`~.draft.Plan` out, each policy
asked in turn and its :class:`~.decision.Decision` applied before the next (the package
docstring says what each decides)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ddp_api.ddpjob import TERMINAL_PHASES, DDPJob
from ddp_api.status import StatusFields

from .. import queueing, render
from . import admission as kueue
from .completion import COMPLETION_GRACE_S, completion
from .converge import converge
from .draft import Draft, Plan
from .failures import failures
from .lifecycle import finished, past_deadline, resumed, suspended
from .lost_machines import NODE_LOST_GRACE_S, lost_machines
from .placement import rebalance
from .problems import diagnosed
from .progress import take_report
from .stall import stall
from .views import MachineView, PodView


@dataclass(frozen=True)
class PlanSettings:
    """What the operator is configured with that the planner reads (its part of
    :class:`ddp_operator.settings.Settings`)."""

    render: render.OperatorConfig = field(default_factory=render.OperatorConfig)
    backoff_base_s: float = 10.0  # first delay before a failed pod is recreated; doubles after
    # Once a node finished training, how long the others get to finish before they are stopped.
    completion_grace_s: float = COMPLETION_GRACE_S
    # A machine not Ready (or silent) this long loses its job pods at once.
    node_lost_grace_s: float = NODE_LOST_GRACE_S


def plan(
    job: DDPJob,
    status: StatusFields,
    pods: Iterable[PodView],
    now: dt.datetime,
    settings: PlanSettings,
    *,
    pending: Collection[str] = (),
    admission: queueing.Admission | None = None,
    progress: Mapping[str, Any] | None = None,
    machines: Mapping[str, MachineView] | None = None,
    services: Mapping[str, str] | None = None,
    foreign: Collection[PodView] = (),
) -> Plan:
    """Decides what to do for one observation of a job; see the package docstring.

    ``pending`` names pods created moments ago that the watch has not shown yet; ``admission``
    is Kueue's decision for a job in a Kueue queue (None: not queued, run as usual);
    ``progress`` is rank 0's newest valid report (:func:`ddp_operator.reports.parse`), copied
    into ``status.progress`` with the time it estimates is left
    (:func:`ddp_operator.reports.remaining_seconds`) when it differs; ``machines`` are the
    cluster's Nodes by name (None: not known); ``services`` are the Services with the job's
    name label that exist, by name, each with the uid of its controller ("" for none: such
    a one of a name the job needs is adopted); ``foreign`` are pods with the job's name label
    that it does not control (:func:`~ddp_operator.planner.views.split_by_owner`): never
    counted, their names wait (:func:`~ddp_operator.planner.converge.converge`, which makes
    every pod the plan creates). The plan creates no object that exists already (a pod or
    Service of that name)."""
    observed = list(pods)
    p = _decide(
        job, status, observed, now, settings, pending, admission, progress, machines, foreign
    )
    services = services or {}
    exist = {"Pod": {x.name for x in observed}, "Service": set(services)}
    p.create = [o for o in p.create if o["metadata"]["name"] not in exist.get(o["kind"], ())]
    p.adopt = orphans(job, services)
    return p


def orphans(job: DDPJob, services: Mapping[str, str]) -> list[str]:
    """The Services of names the job needs that nothing controls (``kubectl delete
    --cascade=orphan`` of an earlier job of its name, or made by hand): they serve the job as
    they are (their selectors are by the job's name), and the job adopts them, so that they go
    with it. One another job controls (an earlier one's, not yet collected) is left to go."""
    wanted = [s["metadata"]["name"] for s in render.render_services(job)]
    return [name for name in wanted if services.get(name) == ""]


def _decide(
    job: DDPJob,
    status: StatusFields,
    pods: list[PodView],
    now: dt.datetime,
    settings: PlanSettings,
    pending: Collection[str],
    admission: queueing.Admission | None,
    progress: Mapping[str, Any] | None,
    machines: Mapping[str, MachineView] | None,
    foreign: Collection[PodView] = (),
) -> Plan:
    """:func:`plan`'s policies, asked in turn."""
    st = Draft.observe(job, status, pods, now, pending, foreign)
    machines = machines or {}
    st.apply(take_report(st, progress))
    prev_phase = status.get("phase") or ""

    if prev_phase in TERMINAL_PHASES:
        return st.conclude(finished(st, prev_phase))
    if job.spec.suspend:
        return st.conclude(suspended(st, prev_phase, admission))
    if admission is not None:
        if admission.state != queueing.State.ADMITTED:
            return st.conclude(kueue.queued(st, prev_phase, admission))
        st.job = queueing.admitted_job(job, admission)  # what Kueue admitted it with
        st.apply(kueue.admitted(st, admission))
    st.apply(resumed(prev_phase))
    late = st.apply(past_deadline(st))
    if late is not None:
        return late
    decided, lost = lost_machines(st, machines, settings.node_lost_grace_s)
    st.apply(decided)
    done = st.apply(completion(st, settings.completion_grace_s))
    if done is not None:
        return done
    failed = st.apply(failures(st))
    if failed is not None:
        return failed
    stalled = st.apply(stall(st, prev_phase))
    if stalled is not None:
        return stalled
    decided, found = diagnosed(st)
    failing = st.apply(decided)
    if failing is not None:
        return failing
    st.apply(rebalance(st, prev_phase, machines))
    decided = converge(
        st, prev_phase, settings.render, settings.backoff_base_s, found, machines, lost
    )
    return st.conclude(decided)
