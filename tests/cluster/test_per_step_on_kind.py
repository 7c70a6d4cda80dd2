"""Per-step fault tolerance on the kind cluster (``spec.faultTolerance.mode: PerStep``): a node
pod deleted, a worker's machine powered off (its group replaced beside another, then moved back
when the machine is on again), then the lighthouse pod deleted while charlm trains; the other
replica groups keep stepping, each lost group is replaced alone and heals from a live one, the
lighthouse is recreated with no group touched, and the job Succeeds with no restart and no step
trained twice. Then the own-script-per-step example (a user's torchft script): a deleted
group's new pod heals from a live one and the job Succeeds."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from cluster_env import Cluster
from test_cluster import lone_groups, machines

from ddp_api.contract import parse_rfc3339
from ddp_devcluster import goodput
from ddp_devcluster.harness import holding_at
from ddp_devcluster.kind import cluster as kind
from ddp_devcluster.pytest_plugin import unavailable
from ddp_trainer import hold
from ddp_trainer.reporting.run_log import read_run_log

pytestmark = pytest.mark.timeout(1500)
CONTROL_PLANE = "ddp-control-plane"
WORKERS = ("ddp-worker", "ddp-worker2", "ddp-worker3")
JOB, CLAIM = "charlm-per-step", "charlm-per-step-checkpoints"
GROUP_TIMEOUT_S = 5  # charlm-per-step.yaml's faultTolerance.groupTimeoutSeconds
# The survivors' longest pause per incident: a lost group is dropped after the group timeout;
# a collective it was in fails after the same timeout, then one quorum more.
STALL_BOUND_S = 3 * GROUP_TIMEOUT_S
# Hold points: every group up before the scenes (10), then one ceiling a scene. Survivors that
# reach a scene's ceiling before the scene is over wait there until the lost group (or the
# lighthouse) is back, so the run cannot end before its scenes on any machine, and ends soon
# after them. Held time is no one's stall (goodput leaves it out).
UP, CEILINGS, LAST_STEP = 10, (60, 120, 180), 200


def groups(cluster: Cluster, ns: str, since: float = 0.0) -> int:
    """The groups that trained the step of the job's newest report, if made after ``since``."""
    progress = cluster.status(JOB, ns=ns).get("progress") or {}
    at = parse_rfc3339(progress.get("updatedAt"))
    fresh = at is not None and at.timestamp() > since + 1  # whole seconds
    return int(progress.get("groups") or 0) if fresh else 0


def running(cluster: Cluster, ns: str) -> bool:
    return cluster.status(JOB, ns=ns).get("phase") == "Running"


def replaced(cluster: Cluster, ns: str, pod: str, before: dict[str, str], job: str = JOB) -> bool:
    """Whether ``pod`` exists again with another uid than in ``before``."""
    return cluster.worker_uids(job, ns=ns).get(pod) not in (None, before[pod])


def started(cluster: Cluster, ns: str, pod: str) -> bool:
    """Whether ``pod`` has started its replica group (it asks for quorums from now)."""
    return "replica group" in cluster.k("logs", pod, ns=ns, check=False)


def joining(cluster: Cluster, ns: str, pod: str, before: dict[str, str]) -> bool:
    """Whether ``pod``'s replacement has started its replica group (it asks for a quorum next;
    minGroups 2 keeps it from training alone)."""
    return replaced(cluster, ns, pod, before) and started(cluster, ns, pod)


def anomalies(rows: list[dict[str, Any]], last: int) -> str:
    """The run log's steps lost or written twice, each with the lines around it (which group
    wrote what, in which quorum, when)."""
    steps = [r["step"] for r in rows if r.get("event") == "step"]
    lost = sorted(set(range(1, last + 1)) - set(steps))
    twice = sorted({s for s in steps if steps.count(s) > 1})
    keys = ("event", "time", "step", "group", "quorum", "groups", "attempt", "loss")
    around = [
        {k: r[k] for k in keys if k in r}
        for r in rows
        if r.get("event") != "step"  # starts, holds, checkpoints: every one
        or any(abs(r["step"] - s) <= 1 for s in lost + twice)
    ]
    lines = "\n".join(map(str, around))
    return f"steps lost {lost}, written twice {twice}; the run log there:\n{lines}"


def scene(
    cluster: Cluster, ns: str, what: str, over: Callable[[], bool], ceiling: int,
    may_go: Callable[[], bool],
) -> None:  # fmt: skip
    """Waits until ``over``. Survivors held at ``ceiling`` meanwhile are let go once ``may_go``
    (what they would wait for is back); the ceiling is released when the scene is over."""
    folder = kind.claim_folder(cluster, CLAIM, ns=ns)

    def check() -> bool | None:
        if over():
            return True
        progress = cluster.status(JOB, ns=ns).get("progress") or {}
        if progress.get("heldAtStep") == ceiling and may_go():
            hold.release(folder, ceiling)
        return None

    cluster.until(what, check, 300, ns=ns)
    hold.release(folder, ceiling)


def test_per_step_groups_train_on_through_a_deleted_pod_and_a_powered_off_machine(
    cluster: Cluster, ns: str
) -> None:
    if cluster.provider != "kind":
        unavailable("one machine only: losing it loses the cluster (DDP_CLUSTER=kind)")
    cluster.k("cordon", CONTROL_PLANE)  # a group per worker machine, the lighthouse beside one
    for worker in WORKERS:  # back from earlier tests: Ready, none of the lost machines' taints
        kind.wait_ready(cluster.kubeconfig, worker)

    def edit(job: dict[str, Any]) -> None:
        holding_at(UP, *CEILINGS, last=LAST_STEP)(job)  # spread: Preferred, the default
        job["spec"]["minNodes"] = 2
        job["spec"]["faultTolerance"]["minGroups"] = 2  # a replacement never trains alone
        job["spec"]["trainer"].update(logEverySteps=1, epochs=10)  # 92 steps an epoch

    incidents: list[float] = []
    off: list[str] = []
    first, second, third = CEILINGS
    try:
        cluster.apply_example(cluster.claims, "charlm-per-step.yaml", edit=edit, ns=ns)
        cluster.held(JOB, UP, 900, ns=ns)
        # minGroups 2: two groups can reach UP before the third has started (seen: its pod
        # started 2 s after theirs, and they trained 10 steps in 2 s). Held groups ask for no
        # quorum, so it joins at their next one: UP is let go once every group has started.
        pods = [f"{JOB}-node-{i}" for i in range(3)]
        cluster.until(
            "every group started", lambda: all(started(cluster, ns, p) for p in pods), 300, ns=ns
        )
        hold.release(kind.claim_folder(cluster, CLAIM, ns=ns), UP)
        cluster.until("3 groups", lambda: groups(cluster, ns) == 3 or None, 300, ns=ns)
        uids = cluster.worker_uids(JOB, ns=ns)
        # A group per worker machine (the spread, with every machine heard: wait_ready above),
        # which the scenes below start from.
        placed = {p: m for p, m in machines(cluster, ns, JOB).items() if p in pods}
        assert len(set(placed.values())) == 3, f"groups placed together at the start: {placed}"

        node1 = f"{JOB}-node-1"
        assert running(cluster, ns)
        # Scene 1: a node pod deleted. The others train on; its replacement heals and joins.
        cluster.k("delete", "pod", node1, "-n", ns, "--wait=false")
        incidents.append(time.time())
        print(f"deleted {node1} at step {cluster.status(JOB, ns=ns)['progress']['step']}")
        at = incidents[-1]

        def back() -> bool:
            return replaced(cluster, ns, node1, uids) and groups(cluster, ns, at) == 3

        scene(cluster, ns, "node-1 replaced and back in the quorum", back, first,
              lambda: joining(cluster, ns, node1, uids))  # fmt: skip
        untouched = cluster.worker_uids(JOB, ns=ns)
        assert {p: untouched[p] for p in (f"{JOB}-node-0", f"{JOB}-node-2")} == {
            p: uids[p] for p in (f"{JOB}-node-0", f"{JOB}-node-2")
        }, "another group's pod was replaced"

        # Scene 2: the machine of a group alone on it, the lighthouse elsewhere (one group lost,
        # as the stall bound assumes), powered off: node-0's, the writer's group (the first of
        # the groups at the step), when it is so placed, else the next one's (node-0 was beside
        # the lighthouse in 3 of 7 runs on 2026-11-28). The pod is replaced once the operator
        # sees the machine lost, beside another group (spread Preferred), and moved back to its
        # machine once that is powered on again (a Rebalance); the survivors, held at the
        # scene's ceiling meanwhile, are let go once it has started there.
        where = machines(cluster, ns, JOB)
        alone = lone_groups(where, JOB)
        assert alone, f"no group alone on a machine without the lighthouse: {where}"
        victim = alone[0]
        machine = where[victim]
        kind.power_off(machine)
        off.append(machine)
        incidents.append(time.time())
        print(
            f"powered off {machine} ({victim}; the lighthouse is on {where[f'{JOB}-lighthouse']})"
        )
        cluster.until(f"{victim} replaced", lambda: replaced(cluster, ns, victim, untouched)
                      or None, 300, ns=ns)  # fmt: skip
        beside = machines(cluster, ns, JOB)[victim]
        print(f"{victim} replaced on {beside}")
        kind.power_on(cluster.kubeconfig, machine)
        off.remove(machine)
        home_at: list[float] = []

        def home() -> bool:
            """The victim's group on its own machine again (a new pod), started there."""
            there = machines(cluster, ns, JOB).get(victim) == machine
            if not (there and started(cluster, ns, victim)):
                return False
            home_at[:] = home_at or [time.time()]
            return True

        scene(cluster, ns, f"{victim} back on {machine}, 3 groups again",
              lambda: home() and groups(cluster, ns, home_at[0]) == 3, second, home)  # fmt: skip
        # One move since the power-off (whole seconds). Counted from then: a move before it is
        # not this scene's (scene 1's replacement placed beside another group, say). Twice in
        # CI the groups started on fewer than three machines and one was moved out early; the
        # second time because two machines' heartbeats were not heard yet, which the start now
        # waits for and the assertion after it names.
        assert len(goodput.moves(cluster.status(JOB, ns=ns), since=incidents[-1] - 1)) == 1
        said = [m for _, r, m in cluster.events(JOB, ns=ns) if r == "Rebalancing"]
        print(f"moves: {said}")
        assert any(m.startswith(f"{victim} shares machine {beside}") and machine in m
                   for m in said), said  # fmt: skip

        # Scene 3: the lighthouse pod deleted. It is recreated (same Service); the groups ask
        # the new one for their next quorum and go on from their step, none restarted.
        beacon_uid = cluster.pods(f"ddp.dev/job-name={JOB}", ns=ns)[f"{JOB}-lighthouse"]
        nodes_before = cluster.worker_uids(JOB, ns=ns)
        cluster.k("delete", "pod", f"{JOB}-lighthouse", "-n", ns, "--wait=false")
        incidents.append(time.time())
        print("deleted the lighthouse pod")
        at3 = incidents[-1]

        def new_beacon() -> dict[str, Any] | None:
            pod = cluster.pods(f"ddp.dev/job-name={JOB}", ns=ns).get(f"{JOB}-lighthouse")
            uid = beacon_uid["metadata"]["uid"]
            return pod if pod and pod["metadata"]["uid"] != uid else None

        def beacon_up() -> bool:
            pod = new_beacon()
            return pod is not None and pod.get("status", {}).get("phase") == "Running"

        scene(cluster, ns, "a step after the lighthouse was deleted",
              lambda: groups(cluster, ns, at3 + 2) > 0, third, beacon_up)  # fmt: skip
        assert cluster.worker_uids(JOB, ns=ns) == nodes_before, "a group was replaced"
        # The old lighthouse may have served that step: the kubelet stops it seconds after the
        # delete, and only then can the operator make the new one (the same name)
        cluster.until("the new lighthouse", new_beacon, 120, ns=ns)
        done = cluster.phase(JOB, "Succeeded", 900, ns=ns)
    finally:
        for machine in off:
            kind.power_on(cluster.kubeconfig, machine)
        cluster.k("uncordon", CONTROL_PLANE, check=False)

    print(f"restarts {done.get('restarts', 0)}, disruptions {done.get('disruptions')}")
    assert done["progress"]["step"] == LAST_STEP, done
    assert done.get("restarts", 0) == 0 and done.get("disruptions", 0) >= 2, done
    kinds = [i["kind"] for i in done.get("incidents") or []]
    assert "LighthouseLost" in kinds and "Rebalance" in kinds, kinds
    rows = read_run_log(kind.claim_folder(cluster, CLAIM, ns=ns))
    steps = [r["step"] for r in rows if r.get("event") == "step"]
    assert steps == list(range(1, LAST_STEP + 1)), anomalies(rows, LAST_STEP)
    every_incident = sorted(incidents + goodput.moves(done))  # the moves' stalls too
    figures = goodput.summary(rows, every_incident)
    held = [r["step"] for r in rows if r.get("event") == "hold"]
    print(f"survivors' stalls {figures['stalls_s']} s, goodput {figures['goodput']}, held {held}")
    # The operator's own account from the reports alone: paused time is neither kept nor lost
    # (lower than the run log's: each incident here follows a hold point's report, which gives
    # no pace, so the steps across it count as lost; 0.69 and 0.57 against 0.81 and 0.72).
    assert done["heldSeconds"] > 0 and 0 < done["goodput"] <= 1, done
    print(f"status: goodput {done['goodput']}, paused {done['heldSeconds']} s")
    by = Counter(r.get("group") for r in rows if r.get("event") == "step")
    print(f"step lines by writer group {dict(by)}")
    assert figures["steps_redone"] == 0
    assert max(figures["stalls_s"]) <= STALL_BOUND_S, figures
    assert min(r.get("groups", 3) for r in rows if r.get("event") == "step") < 3  # it did drop


OWN = "own-script-per-step"
OWN_HOLD, OWN_STEPS = 100, 200  # the script's HOLD_AT_STEP and STEPS (spec.template.env)


def script_lines(log: str) -> list[str]:
    """The script's own lines of a pod's log, without torchrun's ``[rank0]:`` prefix."""
    return [re.sub(r"^\[rank\d+\]:\s?", "", line) for line in log.splitlines()]


def test_own_script_per_step_groups_train_on_while_a_deleted_group_heals_from_a_live_one(
    cluster: Cluster, ns: str
) -> None:
    """own-script-per-step.yaml, a user's torchft script (Manager, Manager.allreduce, torchft's
    Optimizer). Its three groups are held at step 100; one group's pod is deleted, and the
    others are let go only once its replacement asks for a quorum (minGroups 2: it cannot train
    alone). The new pod heals from a live group at step 100, not from step 0, and the job
    Succeeds with no restart, every group, the healed one included, having run to the last
    step.

    A group whose pod started late may find the others past its first quorum (100 steps of
    this script take under a second) and then held, asking for none: it asks alone and can
    never step. Then that group's pod is the one deleted (a whole-suite run waited 600 s for
    it to be held); its replacement is what the test is about either way."""

    def edit(job: dict[str, Any]) -> None:
        job["spec"]["template"]["env"] = [
            {"name": "STEPS", "value": str(OWN_STEPS)},
            {"name": "HOLD_AT_STEP", "value": str(OWN_HOLD)},
        ]
        job["spec"]["minNodes"] = 2
        job["spec"]["faultTolerance"]["minGroups"] = 2

    cluster.apply_example(cluster.claims, f"{OWN}.yaml", edit=edit, ns=ns)
    pods = [f"{OWN}-node-{i}" for i in (0, 1, 2)]

    def said(pod: str, text: str) -> bool:
        lines = script_lines(cluster.k("logs", pod, ns=ns, check=False))
        return any(text in line for line in lines)

    held = f"held at step {OWN_HOLD}"

    def at_hold() -> str | None:
        """The pod to delete once every group is at the hold: node-1 when all three are held
        there, or the one group that asks for a quorum while the two others are held."""
        waiting = [p for p in pods if not said(p, held)]
        if not waiting:
            return pods[1]
        if len(waiting) == 1 and said(waiting[0], "starting quorum"):
            return waiting[0]
        return None

    lost = cluster.until("every group held, or all but one asking alone", at_hold, 600, ns=ns)
    others = [p for p in pods if p != lost]
    before = cluster.worker_uids(OWN, ns=ns)
    cluster.k("delete", "pod", lost, ns=ns)

    def asking() -> bool:
        return replaced(cluster, ns, lost, before, OWN) and said(lost, "starting quorum")

    cluster.until(f"the new {lost} asking for a quorum", asking, 600, ns=ns)
    # The new pod first: healed to step 100 it would hold there like the others, and left
    # held it never finished (the others trained on without it, and the operator stopped it
    # DDP_COMPLETION_GRACE_S after they completed). It cannot heal before a held one is let go.
    for pod in [lost, *others]:
        cluster.k("exec", pod, "--", "touch", "/tmp/release", ns=ns)
    done = cluster.phase(OWN, "Succeeded", 900, ns=ns)
    assert done.get("restarts", 0) == 0, done
    (ended,) = [c for c in done["conditions"] if c["type"] == "Succeeded"]
    assert "did not finish" not in ended["message"], ended
    new = script_lines(cluster.k("logs", lost, ns=ns))
    healed = [int(line.rsplit(" ", 1)[1]) for line in new
              if line.startswith("healed from a live group at step ")]  # fmt: skip
    assert healed == [OWN_HOLD], new[-40:]
    for pod in pods:  # every group ran to the last step, the healed one included
        lines = script_lines(cluster.k("logs", pod, ns=ns))
        assert any(line.startswith(f"done at step {OWN_STEPS} ") for line in lines), lines[-40:]
