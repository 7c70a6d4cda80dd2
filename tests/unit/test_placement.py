"""PerStep's rebalance (``ddp_operator.planner.placement``), through the pure planner: a group
placed beside another while its machine was away is moved once that machine is back, one
group at a time, never twice for one return, and never where the spread constraint would not
count the machine or in a mode where a move costs more than the group."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import planner_pods
import pytest
from ddpjobs import ddpjob

from ddp_api.ddpjob import DDPJob
from ddp_operator import render
from ddp_operator.planner import placement, views
from ddp_operator.planner.plan import PlanSettings, plan

NOW = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
EARLIER = "2026-01-01T11:00:00Z"
PLACED = "2026-01-01T11:58:00Z"  # node-2's replacement, while machine c was away
BACK = "2026-01-01T11:59:00Z"  # machine c Ready again
RULES = PlanSettings(render.OperatorConfig(default_image="trainer:test"))
RUNNING = {"phase": "Running", "reason": "AllNodesRunning", "observedGeneration": 1}
PER_STEP = {"mode": "PerStep"}


def job(ft: dict[str, Any] | None = None, **spec: Any) -> DDPJob:
    return ddpjob({"nodes": 3, "faultTolerance": ft or PER_STEP, **spec})


def machine(name: str, since: str = EARLIER, **changes: Any) -> views.MachineView:
    labels = (("kubernetes.io/hostname", name), ("pool", "train"))
    return views.MachineView(name, "True", since, labels=labels, **changes)


def node(index: int, on: str, created: str = EARLIER, **changes: Any) -> views.PodView:
    return planner_pods.pod(index, machine=on, created=created, **changes)


LIGHTHOUSE = planner_pods.pod(-1, role=render.ROLE_LIGHTHOUSE, machine="b")
# node-2's machine c was lost; its replacement went to a, beside node-0; c is Ready again.
SHARED = [LIGHTHOUSE, node(0, "a"), node(1, "b"), node(2, "a", PLACED)]
MACHINES = {"a": machine("a"), "b": machine("b"), "c": machine("c", BACK)}


def decide(
    j: DDPJob | None = None,
    pods: list[views.PodView] | None = None,
    machines: dict[str, views.MachineView] | None = None,
    status: dict[str, Any] | None = None,
) -> Any:
    return plan(
        j or job(),
        status if status is not None else RUNNING,
        SHARED if pods is None else pods,
        NOW,
        RULES,
        machines=MACHINES if machines is None else machines,
    )


def test_a_group_beside_another_moves_once_its_machine_is_ready_again() -> None:
    p = decide()
    assert p.delete == ["j-node-2"] and p.created_pods() == [] and p.force == []
    [(kind, _, text)] = [e for e in p.events if e[1] == "Rebalancing"]
    assert kind == "Normal"
    assert text.startswith("j-node-2 shares machine a with j-node-0 while c has none")
    assert "the other replica groups keep training" in text
    assert p.status["phase"] == "Running" and p.status["restarts"] == 0
    assert "disruptions" not in p.status  # the operator's own deletion is counted nowhere
    assert "uid-j-node-2-Running" in p.status["handledFailures"]
    assert [i["kind"] for i in p.status["incidents"]] == ["Rebalance"]
    # The next look, before the deletion is seen: the same pod is not moved again.
    assert decide(status=p.status).delete == []
    # Then node-2 is going; no other group moves, and the job trains on.
    going = [*SHARED[:-1], dataclasses.replace(SHARED[-1], deleting=True)]
    after = decide(pods=going, status=p.status)
    assert after.delete == [] and after.status["reason"] == "GroupsChanging"
    assert after.status.get("disruptions") is None and after.status["restarts"] == 0
    # Gone: recreated (the scheduler's spread constraint favours machine c).
    gone = decide(pods=SHARED[:-1], status=after.status)
    assert gone.created_pods() == ["j-node-2"] and gone.delete == []


def test_a_machine_heard_again_before_its_node_turned_unknown_counts_as_back() -> None:
    machines = {**MACHINES, "c": machine("c", EARLIER, back_since=BACK)}
    assert decide(machines=machines).delete == ["j-node-2"]


def test_a_replacement_placed_after_the_machine_came_back_is_not_moved_again() -> None:
    """The move landed on a crowded machine again (c lacked room): no churn."""
    again = [*SHARED[:-1], node(2, "a", "2026-01-01T11:59:30Z", uid="second")]
    p = decide(pods=again)
    assert p.delete == [] and not [e for e in p.events if e[1] == "Rebalancing"]
    # Nor is a pod placed beside another while the empty machine was there all along.
    assert decide(machines={**MACHINES, "c": machine("c", EARLIER)}).delete == []


def test_the_newest_pod_of_the_most_crowded_machine_moves_first_one_at_a_time() -> None:
    pods = [
        LIGHTHOUSE,
        node(0, "a"),
        node(1, "a", "2026-01-01T11:50:00Z"),
        node(2, "a", PLACED),
        node(3, "b"),
    ]
    machines = {**MACHINES, "d": machine("d", BACK)}
    p = decide(job(nodes=4), pods, machines)
    assert p.delete == ["j-node-2"]
    assert "j-node-2 shares machine a with j-node-0, j-node-1 while c, d each have none" in str(
        p.events
    )
    # node-2 went to c: a still runs two to d's none, and node-1 is the last placed there.
    moved = [*pods[:3], node(2, "c", "2026-01-01T11:59:30Z", uid="moved"), pods[4]]
    assert decide(job(nodes=4), moved, machines).delete == ["j-node-1"]


def test_an_uneven_spread_by_one_is_what_maxskew_allows() -> None:
    pods = [LIGHTHOUSE, node(0, "a"), node(1, "b"), node(2, "c"), node(3, "a", PLACED)]
    assert decide(job(nodes=4), pods).delete == []


@pytest.mark.parametrize(
    ("j", "why"),
    [
        (job({"mode": "Restart"}), "a move would restart every worker"),
        (job(spread="Required"), "a replacement waits for a machine of its own"),
        (job(spread="None"), "no spread asked for"),
        (
            job(
                template={
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 2,
                            "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "ScheduleAnyway",
                            "labelSelector": {"matchLabels": {"ddp.dev/job-name": "j"}},
                        }
                    ]
                }
            ),
            "the user's own constraint on the machine",
        ),
        (job({**PER_STEP, "minGroups": 3}), "the moved group would leave too few"),
    ],
)
def test_no_move_where_it_costs_more_than_one_group_or_the_user_spreads(
    j: DDPJob, why: str
) -> None:
    assert decide(j).delete == [], why


@pytest.mark.parametrize(
    ("pods", "status", "why"),
    [
        (
            [*SHARED[:-1], dataclasses.replace(SHARED[-1], ready=False)],
            RUNNING,
            "a group not ready",
        ),
        (SHARED[:-1], RUNNING, "a group missing"),
        (SHARED, {**RUNNING, "phase": "Restarting"}, "not Running"),
        (
            SHARED,
            {**RUNNING, "progress": {"step": 100, "totalSteps": 100}},
            "training finished",
        ),
    ],
)
def test_no_move_unless_every_group_trains(
    pods: list[views.PodView], status: dict[str, Any], why: str
) -> None:
    assert decide(pods=pods, status=status).delete == [], why


@pytest.mark.parametrize(
    ("c", "why"),
    [
        (machine("c", BACK, unschedulable=True), "cordoned"),
        (machine("c", BACK, taints=(("gpu", "", "NoSchedule"),)), "a taint not tolerated"),
        (machine("c", BACK, silent_since=BACK), "silent"),
        (dataclasses.replace(machine("c", BACK), ready="Unknown"), "not Ready"),
        (
            dataclasses.replace(machine("c", BACK), labels=(("pool", "other"),)),
            "outside the nodeSelector",
        ),
    ],
)
def test_no_move_to_a_machine_the_spread_constraint_does_not_count(
    c: views.MachineView, why: str
) -> None:
    j = job(template={"nodeSelector": {"pool": "train"}})
    assert decide(j, machines={**MACHINES, "c": c}).delete == [], why


def test_a_tolerated_taint_and_a_matching_node_affinity_allow_the_move() -> None:
    c = machine("c", BACK, taints=(("gpu", "h200", "NoSchedule"), ("x", "", "PreferNoSchedule")))
    in_pool = {"key": "pool", "operator": "In", "values": ["train"]}
    required = {"nodeSelectorTerms": [{"matchExpressions": [in_pool]}]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    tolerations = [{"key": "gpu", "operator": "Equal", "value": "h200", "effect": "NoSchedule"}]
    j = job(template={"tolerations": tolerations, "affinity": affinity})
    assert decide(j, machines={**MACHINES, "c": c}).delete == ["j-node-2"]


@pytest.mark.parametrize(
    ("term", "fits"),
    [
        ({"matchExpressions": [{"key": "pool", "operator": "In", "values": ["train"]}]}, True),
        ({"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["train"]}]}, False),
        ({"matchExpressions": [{"key": "pool", "operator": "Exists"}]}, True),
        ({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, True),
        ({"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["4"]}]}, True),
        ({"matchExpressions": [{"key": "gpus", "operator": "Lt", "values": ["4"]}]}, False),
        ({"matchExpressions": [{"key": "pool", "operator": "Gt", "values": ["4"]}]}, False),
        ({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["c"]}]}, True),
        ({"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["c"]}]}, False),
        ({}, False),  # an empty term matches no machine
    ],
)
def test_required_node_affinity_terms(term: dict[str, Any], fits: bool) -> None:
    m = views.MachineView("c", "True", BACK, labels=(("gpus", "8"), ("pool", "train")))
    required = {"nodeSelectorTerms": [term]}
    spec = {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    }
    assert placement.fits(spec, m) is fits


@pytest.mark.parametrize(
    ("toleration", "tolerates"),
    [
        ({"operator": "Exists"}, True),  # every taint
        ({"key": "gpu", "operator": "Exists"}, True),
        ({"key": "gpu", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "gpu", "value": "h200"}, True),  # operator Equal by default
        ({"key": "gpu", "value": "a100"}, False),
        ({"key": "other", "operator": "Exists"}, False),
    ],
)
def test_tolerations(toleration: dict[str, Any], tolerates: bool) -> None:
    assert placement.tolerated([toleration], ("gpu", "h200", "NoSchedule")) is tolerates


def test_a_job_shares_a_machine_while_two_live_node_pods_run_on_one() -> None:
    assert placement.shares_a_machine(SHARED)
    assert not placement.shares_a_machine(SHARED[:-1])
    going = dataclasses.replace(SHARED[-1], deleting=True)
    assert not placement.shares_a_machine([*SHARED[:-1], going])
    beside = [node(0, "b"), LIGHTHOUSE]  # the lighthouse is no group
    assert not placement.shares_a_machine(beside)


def test_a_node_body_gives_what_placement_reads() -> None:
    body = {
        "metadata": {"name": "c", "labels": {"pool": "train", "kubernetes.io/hostname": "c"}},
        "spec": {"unschedulable": True, "taints": [{"key": "gpu", "effect": "NoSchedule"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": BACK}]},
    }
    m = views.machine_view(body)
    assert m.labels == (("kubernetes.io/hostname", "c"), ("pool", "train"))
    assert m.taints == (("gpu", "", "NoSchedule"),) and m.unschedulable and m.since == BACK
