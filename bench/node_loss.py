"""A machine lost under a training job: how long until the job trains again. Prints one JSON
object (its last line) and draws a timeline::

    python bench/node_loss.py [--rounds 5] [--default-rounds 5] [--plot out/node_loss.png]

On the 4-machine kind cluster of `make up` (created and installed if none is up, left up
afterwards). The job is ``digits`` with ``spread: Required`` on the three workers (the control
plane is cordoned and keeps only the operator, so that losing a worker never loses the
operator too), checkpointing every 20 steps and held after each checkpoint step (20, 40, ...).
Each round, at a hold: the machine of one node pod (never the one of the rendezvous store) is
frozen (``podman pause``: kubelet, containerd and the pods stop without a word, as after a
kernel hang or a partition) and the hold is released; then, from the freeze:

- ``not_ready``: the Node's Ready condition turns Unknown (kube-controller-manager's
  node-monitor grace period; kubelet's heartbeats stopped);
- ``replaced``: a pod of the lost one's name with a new uid exists (seen by polling, 0.5 s);
- ``running``: its container started;
- ``first_step``: rank 0 logs a training step of the resumed run (metrics.jsonl, every step).

Two modes, in this order, in one run:

- ``on``: the chart's defaults (the operator deletes a lost machine's pods once its kubelet
  has renewed no Lease, or its Node has not been Ready, for ``settings.nodeLostGraceSeconds``,
  30 s);
- ``default``: that handling switched off (``DDP_NODE_LOST_GRACE_S`` of a day), so the pod is
  left to Kubernetes alone: evicted after the ``unreachable`` toleration (300 s), after which it
  stays Terminating for as long as its kubelet cannot confirm the end. The machine comes back
  (is thawed) ``--default-cap-s`` after the freeze, as a repaired machine would; the numbers of
  this mode are then bounded by that cap, which is the point: without the machine, never.

In mode ``on`` the machine is thawed as soon as the job trains again, and the next round waits
for it to be Ready.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import repo_paths
from repo_paths import REPO

repo_paths.add("tests/cluster")

from cluster_env import Cluster  # noqa: E402
from test_cluster import machines, metrics  # noqa: E402

from ddp_api.contract import parse_rfc3339  # noqa: E402
from ddp_api.pods import LABEL_JOB  # noqa: E402
from ddp_devcluster.chart import install_chart  # noqa: E402
from ddp_devcluster.kind import cluster as kind  # noqa: E402
from ddp_trainer.hold import release  # noqa: E402

NS = "bench-node-loss"
JOB = "digits"
EVERY = 20
CONTROL_PLANE = f"{kind.NAME}-control-plane"
OFF_S = 86400  # DDP_NODE_LOST_GRACE_S of the default mode: a day, i.e. never in a round


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pods(cl: Cluster) -> dict[str, dict[str, Any]]:
    out = json.loads(cl.k("get", "pods", "-n", NS, "-l", f"{LABEL_JOB}={JOB}", "-o", "json"))
    return {p["metadata"]["name"]: p for p in out["items"]}


def node_ready(cl: Cluster, node: str) -> tuple[str, float]:
    obj = json.loads(cl.k("get", "node", node, "-o", "json"))
    cond = next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")
    return cond["status"], _seconds(cond["lastTransitionTime"])


def started_at(pod: dict[str, Any]) -> float | None:
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        running = (c.get("state") or {}).get("running")
        if running and running.get("startedAt"):
            return _seconds(running["startedAt"])
    return None


def _seconds(stamp: str) -> float:
    """The POSIX time of a timestamp the API server wrote (never empty there)."""
    at = parse_rfc3339(stamp)
    assert at is not None, stamp
    return at.timestamp()


def operator_mode(cl: Cluster, grace_s: float | None) -> None:
    """The chart's operator with its node-loss grace (None: the chart's default), pinned to the
    control plane (chart values, so that Helm stays the one manager of the Deployment); the
    control plane is cordoned afterwards so that the job never lands there."""
    cl.k("uncordon", CONTROL_PLANE)
    values = [f"nodeSelector.kubernetes\\.io/hostname={CONTROL_PLANE}"]
    if grace_s is not None:
        values.append(f"settings.nodeLostGraceSeconds={grace_s:g}")
    install_chart(cl.kubeconfig, cl.operator_image, cl.trainer_image, "IfNotPresent",
                  values=values)  # fmt: skip
    cl.k("rollout", "status", "deploy/ddp-operator", "-n", "ddp-system", "--timeout=300s")
    cl.k("cordon", CONTROL_PLANE)


def start_job(cl: Cluster, rounds: int) -> None:
    cl.k("delete", "ddpjob", JOB, "-n", NS, "--ignore-not-found", "--wait=true")
    cl.k("delete", "pvc", "digits-checkpoints", "-n", NS, "--ignore-not-found", "--wait=true")

    def edit(job: dict[str, Any]) -> None:
        spec = job["spec"]
        spec["spread"] = "Required"
        spec["backoffLimit"] = 10  # the default mode must measure, not fail the job
        spec["trainer"]["epochs"] = rounds + 1  # about 23 steps an epoch, a hold every 20
        spec["trainer"]["holdAtSteps"] = [EVERY * (k + 1) for k in range(rounds)]
        spec["trainer"]["logEverySteps"] = 1

    cl.apply_example(cl.claims, "digits.yaml", edit=edit, ns=NS)


def first_step_after(folder: Path, since: float, hold: int) -> float | None:
    """When rank 0 logged the first step of a run that started after ``since``."""
    resumed = False
    for r in metrics(folder):
        if r.get("time", 0) < since:
            continue
        if r["event"] == "start":
            resumed = True
        elif resumed and r["event"] == "step" and int(r["step"]) > hold:
            return float(r["time"])
    return None


def one_round(cl: Cluster, hold: int, victim_name: str, cap_s: float | None) -> dict[str, Any]:
    cl.held(JOB, hold, 900, ns=NS)
    where = machines(cl, NS, JOB)
    store_machine = where.get(f"{JOB}-rdzv")
    if where[victim_name] == store_machine:  # a lost store is another story (test_cluster.py)
        victim_name = next(p for p in where if p.startswith(f"{JOB}-node-") and p != victim_name)
    machine = where[victim_name]
    old_uid = pods(cl)[victim_name]["metadata"]["uid"]
    folder = kind.claim_folder(cl, "digits-checkpoints", ns=NS)
    log(f"step {hold}: freezing {machine} ({victim_name}; the store is on {store_machine})")
    t0 = time.time()
    kind.freeze(machine)
    release(folder, hold)
    out: dict[str, Any] = {"hold": hold, "machine": machine, "pod": victim_name, "t0": t0}
    thawed_at: float | None = None
    try:
        while True:
            now = time.time()
            if "not_ready" not in out:
                status, since = node_ready(cl, machine)
                if status != "True" and since >= t0 - 1:
                    out["not_ready"] = since - t0
            current = pods(cl).get(victim_name)
            if current is not None and current["metadata"]["uid"] != old_uid:
                out.setdefault("replaced", now - t0)
                started = started_at(current)
                if started is not None:
                    out.setdefault("running", max(0.0, started - t0))
            elif current is not None and current["metadata"].get("deletionTimestamp"):
                out.setdefault("evicted", now - t0)
            first = first_step_after(folder, t0, hold)
            if first is not None:
                out["first_step"] = first - t0
                break
            if cap_s is not None and thawed_at is None and now - t0 >= cap_s:
                log(f"  {cap_s:.0f}s since the freeze: {machine} comes back")
                kind.thaw(machine)
                thawed_at = now
                out["machine_back"] = now - t0
            if now - t0 > (cap_s or 0) + 900:
                raise RuntimeError(f"no training step {now - t0:.0f}s after freezing {machine}")
            time.sleep(0.5)
    finally:
        if thawed_at is None:
            kind.thaw(machine)
    cl.until(f"{machine} Ready again", lambda: node_ready(cl, machine)[0] == "True" or None, 300)
    log(
        "  "
        + ", ".join(f"{k} {v:.1f}s" for k, v in out.items() if k != "t0" and isinstance(v, float))
    )
    return out


def run_mode(cl: Cluster, mode: str, rounds: int, cap_s: float | None) -> list[dict[str, Any]]:
    operator_mode(cl, None if mode == "on" else OFF_S)
    start_job(cl, rounds)
    out = []
    for k in range(rounds):
        victim = f"{JOB}-node-{k % 2}"
        out.append(one_round(cl, EVERY * (k + 1), victim, cap_s))
    done = cl.phase(JOB, "Succeeded", 900, ns=NS)
    log(f"{mode}: {JOB} Succeeded, restarts {done.get('restarts', 0)},"
        f" disruptions {done.get('disruptions', 0)}")  # fmt: skip
    for r in out:
        r["job_restarts"] = done.get("restarts", 0)
        r["job_disruptions"] = done.get("disruptions", 0)
    add_incidents(out, done.get("incidents") or [])
    return out


def add_incidents(rounds: list[dict[str, Any]], incidents: list[dict[str, Any]]) -> None:
    """What the operator recorded of each round (status.incidents, kind NodeLost, in order):
    when it detected the loss and when training went on, as seconds since that round's
    freeze, beside the bench's own measurements (rank 0's run log)."""
    lost = [i for i in incidents if i.get("kind") == "NodeLost"]
    for r, i in zip(rounds, lost, strict=False):
        r["status_detected"] = _seconds(i["detectedAt"]) - r["t0"]
        if i.get("resumedAt"):
            r["status_resumed"] = _seconds(i["resumedAt"]) - r["t0"]
            r["status_seconds"] = float(i.get("seconds") or 0.0)
            r["status_steps_redone"] = i.get("stepsRedone")


def summary(rounds: list[dict[str, Any]], suffix: str) -> dict[str, Any]:
    firsts = [r["first_step"] for r in rounds]
    replaced = [r["replaced"] for r in rounds if "replaced" in r]
    agree = [abs(r["status_resumed"] - r["first_step"]) for r in rounds if "status_resumed" in r]
    return {
        # status.incidents against the run log: resumedAt is whole seconds of the operator's
        # clock at rank 0's next report (its report interval), first_step rank 0's own time
        f"status_resumed_vs_first_step_max_diff_s{suffix}": round(max(agree), 1) if agree else None,
        f"node_lost_to_first_step_p50_s{suffix}": round(statistics.median(firsts), 1),
        f"node_lost_to_first_step_max_s{suffix}": round(max(firsts), 1),
        f"pod_replaced_p50_s{suffix}": round(statistics.median(replaced), 1) if replaced else None,
    }


def plot(results: dict[str, list[dict[str, Any]]], path: Path, cap_s: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    marks = [
        ("not_ready", "Node NotReady", "tab:orange", "o"),
        ("evicted", "evicted by Kubernetes (Terminating)", "tab:purple", "x"),
        ("machine_back", "machine back (thawed)", "tab:gray", "|"),
        ("replaced", "pod replaced", "tab:blue", "s"),
        ("running", "replacement running", "tab:cyan", "^"),
        ("first_step", "first training step", "tab:green", "D"),
    ]
    height = 1.2 + 0.5 * sum(map(len, results.values()))
    fig, axes = plt.subplots(len(results), 1, figsize=(11, height), squeeze=False)
    for ax, (mode, rounds) in zip(axes[:, 0], results.items(), strict=True):
        for i, r in enumerate(rounds):
            ax.plot([0, r["first_step"]], [i, i], color="lightgray", lw=6, zorder=1)
            for key, label, color, m in marks:
                if key in r:
                    ax.scatter(r[key], i, color=color, marker=m, zorder=2, s=40,
                               label=label if i == 0 or key not in rounds[0] else None)  # fmt: skip
        ax.set_yticks(range(len(rounds)), [f"round {i + 1}" for i in range(len(rounds))])
        ax.invert_yaxis()
        title = {
            "on": "the operator's node-loss handling on (chart defaults)",
            "default": f"handling off: Kubernetes alone (machine back after {cap_s:.0f}s)",
        }
        ax.set_title(title[mode], fontsize=10)
        ax.set_xlabel("seconds since the machine was frozen")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--default-rounds", type=int, default=5)
    ap.add_argument("--default-cap-s", type=float, default=420.0)
    ap.add_argument("--plot", type=Path, default=REPO / "out" / "node_loss.png")
    ap.add_argument("--partial", type=Path, default=REPO / "out" / "node_loss.partial.json")
    ap.add_argument("--default-from", type=Path, default=None,
                    help="take the default mode's rounds from an earlier run's --partial file"
                    " instead of measuring them again (about 7 minutes a round)")  # fmt: skip
    args = ap.parse_args()
    earlier = json.loads(args.default_from.read_text()) if args.default_from else {}
    if earlier:
        args.default_rounds = 0

    kubeconfig = kind.up(log=log)
    remote = kind.install(kubeconfig, log=log)
    cl = Cluster("kind", kubeconfig, remote["operator"], remote["trainer"],
                 claims="checkpoint-pvc-shared.yaml")  # fmt: skip
    cl.k("create", "namespace", NS, check=False)
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        modes = (("on", args.rounds, None), ("default", args.default_rounds, args.default_cap_s))
        for mode, rounds, cap in modes:
            if rounds <= 0:
                continue
            log(f"mode {mode}: {rounds} rounds")
            results[mode] = run_mode(cl, mode, rounds, cap)
            args.partial.parent.mkdir(parents=True, exist_ok=True)
            args.partial.write_text(json.dumps(results, indent=1))
    finally:
        cl.k("uncordon", CONTROL_PLANE, check=False)
        install_chart(cl.kubeconfig, cl.operator_image, cl.trainer_image, "IfNotPresent")
        cl.k("delete", "namespace", NS, "--wait=false", check=False)
    if earlier:
        results["default"] = earlier["default"]
    plot(results, args.plot, args.default_cap_s)
    result: dict[str, Any] = {"rounds": args.rounds,
                              "default_rounds": len(results.get("default", [])),
                              "default_cap_s": args.default_cap_s,
                              "default_from": str(args.default_from or "")}  # fmt: skip
    if "on" in results:
        result |= summary(results["on"], "")
    if "default" in results:
        result |= summary(results["default"], "_default")
    result["detail"] = {m: [{k: round(v, 1) if isinstance(v, float) else v
                             for k, v in r.items() if k != "t0"}
                            for r in rs] for m, rs in results.items()}  # fmt: skip
    result["plot"] = str(args.plot)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
