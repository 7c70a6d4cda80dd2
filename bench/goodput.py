"""What a lost pod or machine costs a training job, in Restart and in PerStep mode: the same
charlm run, the same incidents, one after the other. Prints one JSON object (its last line)
and draws a timeline::

    python bench/goodput.py [--interval-s 60] [--plot out/goodput.png]

On the 4-machine kind cluster of `make up` (created and installed if none is up, left up
afterwards). The job is ``charlm-per-step.yaml`` (charlm) on 3 nodes, one per worker machine
(``--spread``, by default ``Preferred``, the default; the control plane is cordoned and keeps
only the operator), logging every step. Once it trains, one incident every ``--interval-s``
seconds (the issue's "one incident per minute"):

1. node-1's pod deleted;
2. node-2's pod deleted;
3. the machine of node-0's pod powered off (``podman stop --time 0``: never the machine of
   the rendezvous store or the lighthouse), powered on again once its pod has been replaced
   (``Preferred``: beside another pod, where it trains; ``Required``: Pending, since the other
   two machines hold a pod each). In PerStep mode with ``Preferred`` the operator then moves
   that group back to its machine (a ``Rebalance`` incident, counted as an incident of kind
   ``move`` here, at the time the operator recorded, whole seconds);
4. node-1's pod deleted.

The figures come from the job's run log alone (:mod:`ddp_devcluster.goodput`), over a window
from its first step to one interval after the last incident, so that incidents come once an
interval all through it, however fast this machine trains (a run that went on to its end would
dilute them with a clean tail of any length); the job is deleted after it. Each incident's
stall (the longest time without a logged step until the next incident), the steps trained
twice, and goodput (time in steps that were kept / wall time). ``--steps`` only has to outlast
the window: the bench stops with a clear error when the job ends first. Keys of Restart mode
end in ``_restart``; ``..._pod``, ``..._machine`` and ``..._move`` split the stalls by incident
kind (``..._move`` is null where nothing moved).
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
from test_cluster import machines  # noqa: E402

from ddp_api.pods import LABEL_JOB  # noqa: E402
from ddp_devcluster import goodput  # noqa: E402
from ddp_devcluster.chart import install_chart  # noqa: E402
from ddp_devcluster.kind import cluster as kind  # noqa: E402
from ddp_trainer.reporting.run_log import read_run_log  # noqa: E402
from node_loss import operator_mode  # noqa: E402

NS = "bench-goodput"
JOB = "charlm-per-step"  # manifests/examples/charlm-per-step.yaml, in either mode
CLAIM = "charlm-per-step-checkpoints"
CONTROL_PLANE = f"{kind.NAME}-control-plane"
MODES = ("Restart", "PerStep")
INCIDENTS = (("pod", 1), ("pod", 2), ("machine", 0), ("pod", 1))


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def fresh_namespace(cl: Cluster) -> None:
    """The bench's namespace, once a previous run's (deleted without waiting) is gone."""
    cl.k("wait", "--for=delete", f"namespace/{NS}", "--timeout=300s", check=False)
    cl.k("create", "namespace", NS, check=False)


def start_job(cl: Cluster, mode: str, steps: int, spread: str) -> None:
    cl.k("delete", "ddpjob", JOB, "-n", NS, "--ignore-not-found", "--wait=true")
    cl.k("delete", "pvc", CLAIM, "-n", NS, "--ignore-not-found", "--wait=true")

    def edit(job: dict[str, Any]) -> None:
        spec = job["spec"]
        spec.update(nodes=3, minNodes=1, maxNodes=3, spread=spread, backoffLimit=20)
        if mode != "PerStep":  # the example's knobs are PerStep's: Restart takes none
            spec["faultTolerance"] = {"mode": mode}
        spec["trainer"].update(maxSteps=steps, epochs=10000, logEverySteps=1)

    cl.apply_example(cl.claims, "charlm-per-step.yaml", edit=edit, ns=NS)


def step_now(cl: Cluster) -> int:
    return int((cl.status(JOB, ns=NS).get("progress") or {}).get("step") or 0)


def one_incident(cl: Cluster, kind_: str, index: int) -> dict[str, Any]:
    """Causes one incident; returns when it happened and, for a machine, when it came back."""
    where = machines(cl, NS, JOB)
    pod = f"{JOB}-node-{index}"
    hub = {where.get(f"{JOB}-rdzv"), where.get(f"{JOB}-lighthouse")} - {None}
    if kind_ == "machine" and where.get(pod) in hub:  # never the store's or lighthouse's
        pod = next(p for p in sorted(where) if "-node-" in p and where[p] not in hub)
    machine = where.get(pod, "")
    at = time.time()
    out: dict[str, Any] = {"kind": kind_, "pod": pod, "machine": machine, "at": at}
    if kind_ == "pod":
        log(f"deleting pod {pod}")
        cl.k("delete", "pod", pod, "-n", NS, "--wait=false")
        return out
    log(f"powering off {machine} ({pod})")
    kind.power_off(machine)
    old = cl.pods(f"{LABEL_JOB}={JOB}", ns=NS)[pod]["metadata"]["uid"]

    def replaced() -> bool:
        now = cl.pods(f"{LABEL_JOB}={JOB}", ns=NS).get(pod)
        return bool(now and now["metadata"]["uid"] != old)

    cl.until(f"{pod} replaced", replaced, 300, ns=NS)
    out["replaced_s"] = round(time.time() - at, 1)
    kind.power_on(cl.kubeconfig, machine)
    out["back_s"] = round(time.time() - at, 1)
    log(f"  {pod} replaced after {out['replaced_s']}s, {machine} back after {out['back_s']}s")
    return out


def train_until(cl: Cluster, due: float, what: str) -> dict[str, Any]:
    """Waits until ``due`` while the job trains; its status then. A job that ended first is an
    error that says how: run out of steps (raise --steps) or Failed (its reason)."""
    while True:
        status = cl.status(JOB, ns=NS)
        phase = status.get("phase")
        if phase in ("Succeeded", "Failed"):
            how = "raise --steps" if phase == "Succeeded" else status.get("reason")
            step = (status.get("progress") or {}).get("step")
            raise RuntimeError(f"{JOB} {phase} at step {step} before {what}: {how}")
        if time.time() >= due:
            return status
        time.sleep(1)


def run_log_past(cl: Cluster, until: float) -> list[dict[str, Any]]:
    """The job's run log once it has a step after ``until``, which closes the stall of the
    window's last incident (a log read before it would end that stall early)."""

    def logged_past() -> list[dict[str, Any]] | None:
        rows = read_run_log(kind.claim_folder(cl, CLAIM, ns=NS))
        past = any(r.get("event") == "step" and r["time"] > until for r in rows)
        return rows if past else None

    return cl.until("a step logged after the window", logged_past, 300, ns=NS)


def run_mode(cl: Cluster, mode: str, steps: int, interval_s: float, spread: str) -> dict[str, Any]:
    log(f"mode {mode}: {JOB}, 3 nodes, {steps} steps, spread {spread}")
    start_job(cl, mode, steps, spread)
    cl.until(f"{JOB} training", lambda: step_now(cl) >= 5 or None, 900, ns=NS)
    incidents: list[dict[str, Any]] = []
    for kind_, index in INCIDENTS:
        due = (incidents[-1]["at"] if incidents else time.time()) + interval_s
        train_until(cl, due, f"incident {len(incidents) + 1}")
        incidents.append(one_incident(cl, kind_, index))
    until = incidents[-1]["at"] + interval_s  # the window: one interval after the last incident
    done = train_until(cl, until, "the window's end")
    rows = run_log_past(cl, until)
    cl.k("delete", "ddpjob", JOB, "-n", NS, "--wait=false")
    moved = [{"kind": "move", "pod": "", "machine": "", "at": t} for t in goodput.moves(done)]
    incidents = sorted(incidents + moved, key=lambda i: i["at"])
    figures = goodput.summary(rows, [i["at"] for i in incidents], until)
    for k, i in enumerate(incidents):
        i["stall_s"] = figures["stalls_s"][k]
    kinds = ("pod", "machine", "move")
    by_kind = {k: [i["stall_s"] for i in incidents if i["kind"] == k] for k in kinds}
    log(f"{mode}: {done.get('phase')}, restarts {done.get('restarts', 0)}, "
        f"disruptions {done.get('disruptions', 0)}, {figures}")  # fmt: skip
    return {
        **figures,
        "survivor_stall_pod_p50_s": statistics.median(by_kind["pod"]),
        "survivor_stall_machine_s": max(by_kind["machine"]),
        "survivor_stall_move_s": max(by_kind["move"], default=None),
        "phase": done.get("phase"),
        "restarts": done.get("restarts", 0),
        "disruptions": done.get("disruptions", 0),
        "incidents": incidents,
        "rows": [
            {"time": r["time"], "step": r["step"], "groups": r.get("groups")}
            for r in rows
            if r.get("event") == "step" and r["time"] <= until
        ],
    }


def plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 1, figsize=(11, 3.2 * len(results)), squeeze=False)
    for ax, (mode, r) in zip(axes[:, 0], results.items(), strict=True):
        t0 = r["rows"][0]["time"]
        ax.plot([x["time"] - t0 for x in r["rows"]], [x["step"] for x in r["rows"]], ".",
                ms=2, color="tab:blue", label="a logged step")  # fmt: skip
        for i in r["incidents"]:
            color = {"machine": "tab:red", "move": "tab:green"}.get(i["kind"], "tab:orange")
            ax.axvline(i["at"] - t0, color=color, ls="--", lw=1)
            ax.text(i["at"] - t0, 0, f" {i['kind']} {i['pod'].rsplit('-', 1)[-1]}\n"
                    f" stall {i['stall_s']:.1f}s", fontsize=7, va="bottom")  # fmt: skip
        ax.set_title(f"{mode}: goodput {r['goodput']:.2f}, steps redone {r['steps_redone']},"
                     f" stall p50 {r['survivor_stall_p50_s']}s", fontsize=10)  # fmt: skip
        ax.set_xlabel("seconds since the first step")
        ax.set_ylabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--interval-s", type=float, default=60.0, help="between incidents")
    ap.add_argument(
        "--steps", type=int, default=20000, help="each run's maxSteps: more than its window takes"
    )
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--spread", default="Preferred", choices=("Preferred", "Required"))
    ap.add_argument("--plot", type=Path, default=REPO / "out" / "goodput.png")
    args = ap.parse_args()

    kubeconfig = kind.up(log=log)
    remote = kind.install(kubeconfig, log=log)
    cl = Cluster("kind", kubeconfig, remote["operator"], remote["trainer"],
                 claims="checkpoint-pvc-shared.yaml")  # fmt: skip
    fresh_namespace(cl)
    results: dict[str, dict[str, Any]] = {}
    try:
        operator_mode(cl, None)  # the operator on the control plane, which is cordoned
        for mode in args.modes.split(","):
            results[mode] = run_mode(cl, mode, args.steps, args.interval_s, args.spread)
    finally:
        cl.k("uncordon", CONTROL_PLANE, check=False)
        install_chart(cl.kubeconfig, cl.operator_image, cl.trainer_image, "IfNotPresent")
        cl.k("delete", "namespace", NS, "--wait=false", check=False)
    plot(results, args.plot)
    out: dict[str, Any] = {"interval_s": args.interval_s, "steps": args.steps}
    out["spread"] = args.spread
    keys = ("survivor_stall_p50_s", "survivor_stall_max_s", "survivor_stall_pod_p50_s",
            "survivor_stall_machine_s", "survivor_stall_move_s", "steps_redone", "goodput",
            "restarts", "phase")  # fmt: skip
    for mode, r in results.items():
        suffix = "_restart" if mode == "Restart" else ""
        out |= {f"{k}{suffix}": r[k] for k in keys}
    out["incidents"] = {m: [{k: v for k, v in i.items() if k != "at"} for i in r["incidents"]]
                        for m, r in results.items()}  # fmt: skip
    out["plot"] = str(args.plot)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
