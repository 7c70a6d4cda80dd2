"""Lost machines: a pod on a Kubernetes Node not Ready, or silent (no Lease renewal), for longer
than ``node_lost_grace_s`` is deleted at once and recreated elsewhere (the package docstring).
The policy reads the draft and returns its :class:`~.decision.Decision`."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from ddp_api.contract import parse_rfc3339
from ddp_api.ddpjob import ConditionStatus, EventType, IncidentKind, Reason

from .. import render
from .decision import Decision, EventNote
from .draft import Draft
from .groups import LIGHTHOUSE_GONE
from .views import MachineView

NODE_LOST_GRACE_S = 30.0  # Settings.node_lost_grace_s: the default
SILENCE_FLOOR_S = 20.0  # a machine is silent after two missed Lease renewals at the least
STALLED_S = 10.0  # the operator's own silence watch this late: it was stopped, not they
# The API server not ready this long (two ticks' probes): the operator hears no machine. Less
# than a Lease's silence can grow to SILENCE_FLOOR_S in an outage (a kubelet renews every 10 s:
# its last renewal at most 10 s before it), with a tick and a probe's timeout to spare.
DEAF_S = 4.0


def silent_machines(heard: Mapping[str, float], now: float, grace_s: float) -> set[str]:
    """The machines whose heartbeat (kubelet's Lease in kube-node-lease, renewed every 10 s by
    default) was last seen ``grace_s`` (at least :data:`SILENCE_FLOOR_S`) or more before
    ``now``, both on the operator's monotonic clock: a machine's own clock is never compared
    with ours."""
    after = max(grace_s, SILENCE_FLOOR_S)
    return {name for name, at in heard.items() if now - at >= after}


def deaf(answered: float, now: float) -> bool:
    """Whether the API server, last ready at ``answered``, has not been for :data:`DEAF_S` or
    more before ``now``: then no kubelet could renew its Lease either, and a machine's silence
    says nothing of the machine (an API server restarted, or its machine powered off: once it
    answered again, every Lease looked 70 s old and every pod of a job was deleted)."""
    return now - answered >= DEAF_S


def stalled(last: float, now: float, tick_s: float) -> bool:
    """Whether a tick due ``tick_s`` after ``last`` came :data:`STALLED_S` late or more: the
    operator's own process was stopped (its machine frozen) and has heard nothing meanwhile."""
    return now - last - tick_s >= STALLED_S


def _gone(m: MachineView, now: dt.datetime) -> tuple[float, str]:
    """For how long a machine has been lost, and how that shows; (0, "") while it is not."""
    if m.silent_since:
        silent_s = (now - (parse_rfc3339(m.silent_since) or now)).total_seconds()
        return silent_s, f"which has sent no heartbeat (its Lease) for {silent_s:.0f}s"
    if m.ready == ConditionStatus.TRUE:
        return 0.0, ""
    gone_s = (now - (parse_rfc3339(m.since) or now)).total_seconds()
    return gone_s, f"whose Ready condition has been {m.ready} for {gone_s:.0f}s"


def avoid_silent(
    create: list[dict[str, Any]], machines: Mapping[str, MachineView]
) -> list[dict[str, Any]]:
    """``create`` with new pods kept off the silent machines: a silent machine's Node still
    says Ready (and has no taint) until kube-controller-manager's grace runs out, so the
    scheduler would pick it. A required node affinity term ``kubernetes.io/hostname NotIn``
    them is added to every term of the pod's own (terms are ORed, expressions within one
    ANDed)."""
    silent = sorted(n for n, m in machines.items() if m.silent_since)
    if not silent:
        return create
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
    return create


def lost_machines(
    st: Draft, machines: Mapping[str, MachineView], grace_s: float
) -> tuple[Decision, str]:
    """Deletes at once (grace 0) the pods on machines not Ready, or silent, for longer than
    ``grace_s``; returns that decision, and what happened, for the condition ("" when nothing
    did). Reads ``st`` only."""
    said: list[str] = []
    handled: list[str] = []
    force: list[str] = []
    kinds: list[IncidentKind] = []
    events: list[EventNote] = []
    waits: list[float] = []
    disruptions = 0
    for x in st.pods:
        m = machines.get(x.machine) if x.machine else None
        if m is None or x.done:
            continue
        gone_s, how = _gone(m, st.now)
        if not how:
            continue
        if gone_s < grace_s:
            waits.append(grace_s - gone_s)
            continue
        if x.uid in st.handled:  # counted, or deleted by the operator: stuck Terminating there
            if x.deleting:
                force.append(x.name)
            continue
        handled.append(x.uid)
        force.append(x.name)
        what = (
            f"{x.name} was on machine {m.name}, {how} (more than {grace_s:.0f}s):"
            " deleted at once, recreated elsewhere"
        )
        if x.role == render.ROLE_STORE:
            kinds.append(IncidentKind.STORE_LOST)
            events.append((EventType.WARNING, Reason.STORE_LOST, f"{what} (no restart counted)"))
        elif x.role == render.ROLE_LIGHTHOUSE:
            kinds.append(IncidentKind.LIGHTHOUSE_LOST)
            text = f"{what} (no restart counted; {LIGHTHOUSE_GONE})"
            events.append((EventType.WARNING, Reason.LIGHTHOUSE_LOST, text))
        else:
            kinds.append(IncidentKind.NODE_LOST)
            disruptions += 1
            n = st.disruptions + disruptions
            if st.job.spec.per_step:
                text = (
                    f"{what}, alone: the other replica groups keep training (disruption {n};"
                    " not against backoffLimit)"
                )
            else:
                text = f"{what} (disruption {n}; not against backoffLimit)"
            events.append((EventType.WARNING, Reason.NODE_LOST, text))
        said.append(what)
    decision = Decision(
        handled=tuple(handled),
        force=tuple(force),
        incidents=tuple(kinds),
        disruptions=disruptions,
        events=tuple(events),
        requeue_after=min(waits, default=None),
    )
    return decision, "; ".join(said)
