"""PerStep mode's rebalance: a replica group that the scheduler placed beside another, because
the machine it would have had was lost (or not there yet), is moved to that machine once it is
back, so that the next loss of the shared machine does not cost two groups.

With ``spread: Preferred`` (the default) a lost machine's group is replaced at once on a
machine that has one already (the spread constraint is ``ScheduleAnyway``), and trains there;
nothing moves it back when its machine returns. In PerStep mode a move costs only that group
(it is deleted, its replacement heals from a live group, the others train on), so the operator
makes it, one group at a time, when all of these hold:

- the job is Running with every group ready, none coming or going, training not finished,
  nothing else decided in this reconcile, and more than ``minGroups`` groups ready (the moved
  one is missed for a moment);
- among the machines a node pod may be placed on (those the spread constraint counts: Ready,
  heard, not cordoned, every NoSchedule and NoExecute taint tolerated, the pod's nodeSelector
  and required node affinity matched), the most crowded runs at least two more of the job's
  node pods than the least (the constraint's maxSkew 1 is broken);
- a least crowded machine became available (its Ready condition turned True, it was heard
  again after a silence, or it was uncordoned) after the pod placed last on a most crowded one
  was created: the scheduler placed that pod while the machine could not take it.

That pod is deleted (the newest of them, if several machines are most crowded), as the
operator's own deletion (counted nowhere), and recreated like any deleted group; the
scheduler's spread constraint then favours the empty machine. A replacement that lands on a
crowded machine again (the empty one lacked room, which the operator does not see) is the pod
placed last there, and newer than the machine's return: nothing more moves, so nothing
churns. Restart mode never moves a pod (a move would restart every worker), nor does
``spread: Required`` (a replacement waits for a machine of its own) or ``None``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ddp_api.contract import parse_rfc3339
from ddp_api.ddpjob import ConditionStatus, DDPJobPhase, EventType, IncidentKind, Reason

from .. import render
from .decision import NOTHING, Decision
from .draft import Draft, pod_names
from .views import MachineView, PodView

PLACING_EFFECTS = ("NoSchedule", "NoExecute")  # the taints that keep a new pod off a machine


def tolerated(tolerations: Iterable[Mapping[str, Any]], taint: tuple[str, str, str]) -> bool:
    """Whether one of a pod's tolerations tolerates a Node's taint (key, value, effect)."""
    key, value, effect = taint
    for t in tolerations:
        if t.get("effect") and t["effect"] != effect:
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t["key"] == key:
                return True
        elif t.get("key") == key and (t.get("value") or "") == value:
            return True
    return False


def _expression_holds(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """One nodeSelectorRequirement (In, NotIn, Exists, DoesNotExist, Gt, Lt) on ``labels``."""
    key, op, values = expr.get("key", ""), expr.get("operator", ""), expr.get("values") or []
    have = labels.get(key)
    if op == "In":
        return have in values
    if op == "NotIn":
        return have not in values
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt") and have is not None and values:
        try:
            mine, bound = int(have), int(values[0])
        except ValueError:
            return False
        return mine > bound if op == "Gt" else mine < bound
    return False


def _term_holds(term: Mapping[str, Any], labels: Mapping[str, str], name: str) -> bool:
    """A nodeSelectorTerm: its expressions on a machine's labels and its fields (metadata.name)
    all hold; an empty term holds for no machine."""
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not exprs and not fields:
        return False
    names = {"metadata.name": name}
    return all(_expression_holds(e, labels) for e in exprs) and all(
        _expression_holds(f, names) for f in fields
    )


def fits(spec: Mapping[str, Any], m: MachineView) -> bool:
    """Whether a pod of this spec may be placed on the machine, as the spread constraint counts
    it (nodeAffinityPolicy and nodeTaintsPolicy Honor): Ready, not silent, not cordoned, its
    placing taints tolerated, its nodeSelector and required node affinity matched."""
    if m.ready != ConditionStatus.TRUE or m.silent_since or m.unschedulable:
        return False
    tolerations = spec.get("tolerations") or []
    if any(t[2] in PLACING_EFFECTS and not tolerated(tolerations, t) for t in m.taints):
        return False
    labels = dict(m.labels)
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    node = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is not None:
        return any(_term_holds(t, labels, m.name) for t in required.get("nodeSelectorTerms") or [])
    return True


def _available_since(m: MachineView) -> float:
    """Since when a machine could take a pod (Unix time): its Ready condition's turn to True,
    or its return after a silence or a cordon (``back_since``), whichever is later."""
    times = [parse_rfc3339(t) for t in (m.since, m.back_since)]
    return max((t.timestamp() for t in times if t is not None), default=0.0)


def _created(x: PodView) -> float:
    at = parse_rfc3339(x.created)
    return at.timestamp() if at is not None else 0.0


def _steady(st: Draft, prev_phase: str) -> bool:
    """A PerStep job with the operator's ScheduleAnyway spread, Running with every group
    ready, nothing else to do now, and a group to spare."""
    s = st.job.spec
    ft = s.fault_tolerance
    constraint = render.machine_constraint(st.job)
    if ft is None or not ft.per_step or constraint is None:
        return False
    if constraint["whenUnsatisfiable"] != "ScheduleAnyway" or prev_phase != DDPJobPhase.RUNNING:
        return False
    if st.trained() or st.pending or st.plan.delete or st.plan.force:
        return False
    if pod_names(st.plan.create) or "lastFailureTime" in st.new:
        return False
    workers = st.workers
    # A pod the operator deleted (or counted) already, whose deletion is not seen yet, is going.
    ready = [x for x in workers if x.ready and not x.deleting and x.machine]
    ready = [x for x in ready if x.uid not in st.handled]
    return (
        len(workers) == len(ready) == s.nodes
        and {x.index for x in ready} == set(range(s.nodes))
        and len(ready) > ft.groups_min
    )


def rebalance(st: Draft, prev_phase: str, machines: Mapping[str, MachineView]) -> Decision:
    """Moves one group off a crowded machine to one that came back (the module docstring);
    reads ``st`` only."""
    if not _steady(st, prev_phase):
        return NOTHING
    spec = render.pod_spec_overrides(st.job)
    counts = {name: 0 for name, m in machines.items() if fits(spec, m)}
    for x in st.workers:
        if x.machine in counts:
            counts[x.machine] += 1
    if not counts:
        return NOTHING
    low, high = min(counts.values()), max(counts.values())
    if high - low < 2:
        return NOTHING
    empty = [machines[n] for n, c in sorted(counts.items()) if c == low]
    crowded = [x for x in st.workers if counts.get(x.machine) == high]
    newest: dict[str, PodView] = {}  # the last placed on each most crowded machine
    for x in sorted(crowded, key=lambda x: (_created(x), x.index)):
        newest[x.machine] = x
    movable: list[tuple[PodView, list[str]]] = []
    for x in newest.values():  # each with the machines that came back after it was placed
        back = [m.name for m in empty if _available_since(m) > _created(x)]
        if back:
            movable.append((x, back))
    if not movable:
        return NOTHING
    x, back = max(movable, key=lambda pair: (_created(pair[0]), pair[0].index))
    others = [y.name for y in crowded if y.machine == x.machine and y.name != x.name]
    text = (
        f"{x.name} shares machine {x.machine} with {', '.join(others)} while"
        f" {', '.join(back)} {'has' if len(back) == 1 else 'each have'}"
        f" {'none' if low == 0 else low} of this job's node pods and became available after it"
        " was placed: deleting it to be placed again; the other replica groups keep training"
    )
    return Decision(
        delete=(x,),
        incidents=(IncidentKind.REBALANCE,),
        events=((EventType.NORMAL, Reason.REBALANCING, text),),
    )


def shares_a_machine(pods: Iterable[PodView]) -> bool:
    """Whether two live node pods of one job run on one machine: a machine that changes may
    be where one of them moves (:func:`rebalance`)."""
    seen: set[str] = set()
    for x in pods:
        if x.role != render.ROLE_WORKER or x.deleting or x.done or not x.machine:
            continue
        if x.machine in seen:
            return True
        seen.add(x.machine)
    return False
