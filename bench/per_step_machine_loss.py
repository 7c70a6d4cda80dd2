"""What a powered-off machine costs the surviving groups of a PerStep job, whether or not the
machine also ran one of the cluster's DNS servers (CoreDNS). Prints one JSON object (its last
line)::

    python bench/per_step_machine_loss.py [--rounds 3] [--dns only|never|any]

On the 4-machine kind cluster of `make up` (created and installed if none is up, left up
afterwards). Each round is a new ``charlm-per-step.yaml`` job (charlm, 3 groups, one per worker
machine by ``spread: Required``, every step logged; the control plane cordoned, keeping the
operator), trained for 15 s; then the machine of a group alone on it and without the
lighthouse is powered off (``podman stop --time 0``) and powered on again once its pod is
replaced (Pending until then: no group moves back inside the window). ``--dns only`` (the default)
takes only a machine that runs a CoreDNS pod, ``never`` only one that does not; a round whose
placement has no such group is tried again with a new job (up to three times a round; where
CoreDNS runs only on the control plane, as on a kind cluster just made, ``--dns only`` finds none
and says so). The stall is the longest time
without a logged step from the power-off to 15 s after the machine is back
(:mod:`ddp_devcluster.goodput`). Each round's pod logs are copied to ``--out``
(``out/per_step_machine_loss/round-<n>/``).

Why DNS: torch's c10d looks up the name of every TCPStore peer, and while a lost machine's
DNS server is still in the DNS Service a lookup sent there fails only after the resolver's
tries (the pods' ``RES_OPTIONS``, :data:`ddp_operator.render.RESOLVER_OPTIONS`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import repo_paths
from repo_paths import REPO

repo_paths.add("tests/cluster")

from test_cluster import lone_groups  # noqa: E402

import goodput as bench  # noqa: E402  (bench/goodput.py: the same job, cluster and incidents)
from ddp_api.pods import worker_index  # noqa: E402
from ddp_devcluster import goodput  # noqa: E402
from ddp_operator import render  # noqa: E402

JOB, NS = bench.JOB, bench.NS


def dns_machines(cl: bench.Cluster) -> set[str]:
    """The machines that run a CoreDNS pod."""
    pods = cl.pods("k8s-app=kube-dns", ns="kube-system")
    return {p["spec"].get("nodeName", "") for p in pods.values()}


def victim(where: dict[str, str], dns: set[str], want: str) -> str | None:
    """A group alone on its machine, not the lighthouse's, whose machine runs DNS or not as
    ``want`` asks (``only``, ``never``, ``any``); None when the placement has none."""
    for pod in lone_groups(where, JOB):
        if want == "any" or (where[pod] in dns) == (want == "only"):
            return pod
    return None


def one_round(cl: bench.Cluster, want: str, logs: Path) -> dict[str, Any] | None:
    bench.start_job(cl, "PerStep", 20000, "Required")  # no move back inside the window
    cl.until(f"{JOB} training", lambda: bench.step_now(cl) >= 5 or None, 900, ns=NS)
    bench.train_until(cl, time.time() + 15, "the power-off")
    dns, where = dns_machines(cl), bench.machines(cl, NS, JOB)
    pod = victim(where, dns, want)
    if pod is None:
        bench.log(f"no group to take (--dns {want}): {where}, DNS on {sorted(dns)}; a new job")
        return None
    env = cl.pods(f"{bench.LABEL_JOB}={JOB}", ns=NS)[pod]["spec"]["containers"][0]["env"]
    options = next((e.get("value") for e in env if e["name"] == "RES_OPTIONS"), None)
    index = worker_index(JOB, pod)
    assert index is not None, pod
    incident = bench.one_incident(cl, "machine", index)
    assert incident["pod"] == pod, incident
    until = time.time() + 15
    bench.train_until(cl, until, "15 s after the machine is back")
    rows = bench.run_log_past(cl, until)
    stall = goodput.summary(rows, [incident["at"]], until)["stalls_s"][0]
    folder = bench.kind.claim_folder(cl, bench.CLAIM, ns=NS)
    shutil.copytree(folder / "logs", logs, dirs_exist_ok=True)  # each pod's kept log
    out = {**incident, "ran_dns": incident["machine"] in dns, "res_options": options}
    out["stall_s"] = stall
    out["logs"] = str(logs)
    del out["at"]
    bench.log(f"stall {stall} s ({out})")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dns", choices=("only", "never", "any"), default="only")
    ap.add_argument("--out", type=Path, default=REPO / "out" / "per_step_machine_loss")
    args = ap.parse_args()

    kubeconfig = bench.kind.up(log=bench.log)
    remote = bench.kind.install(kubeconfig, log=bench.log)
    cl = bench.Cluster("kind", kubeconfig, remote["operator"], remote["trainer"],
                       claims="checkpoint-pvc-shared.yaml")  # fmt: skip
    bench.fresh_namespace(cl)
    rounds: list[dict[str, Any]] = []
    try:
        bench.operator_mode(cl, None)
        for _ in range(3 * args.rounds):
            if len(rounds) == args.rounds:
                break
            logs = args.out / f"round-{len(rounds) + 1}"
            if (result := one_round(cl, args.dns, logs)) is not None:
                rounds.append(result)
    finally:
        cl.k("uncordon", bench.CONTROL_PLANE, check=False)
        bench.install_chart(cl.kubeconfig, cl.operator_image, cl.trainer_image, "IfNotPresent")
        cl.k("delete", "namespace", NS, "--wait=false", check=False)
    stalls = [r["stall_s"] for r in rounds]
    print(json.dumps({
        "dns": args.dns,
        "resolver_options": render.RESOLVER_OPTIONS,
        "stall_p50_s": statistics.median(stalls) if stalls else None,
        "stall_max_s": max(stalls) if stalls else None,
        "rounds": rounds,
    }))  # fmt: skip
    return 0 if len(rounds) == args.rounds else 1


if __name__ == "__main__":
    sys.exit(main())
