"""How long Kueue's preemption of a training DDPJob takes to free its quota, with real pods.

Runs on the end-to-end stack with real Kueue (``KindStack(kueue=True)``: the kind cluster of
four machines running torchrun in containers, Kueue and the operator as processes here; needs
root). Prints one
JSON object::

    python bench/kueue_preemption.py [--rounds 3]

Each round, in a fresh namespace with a ClusterQueue that has quota for one digits job, applies
``manifests/examples/digits.yaml`` at low priority held after step 25 (``holdAtSteps``), then
the same job at high priority, and polls the API (every 50 ms) and the checkpoint folder:

- ``evicted_to_pods_gone_s``: from the low job's Workload seen Evicted until none of its pods
  is left and its checkpoint of step 25 (written by rank 0 on SIGTERM) is in the folder;
- ``evicted_to_high_admitted_s``: until the high job's Workload is Admitted (the operator has
  released the low one's quota and Kueue admitted the high one).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from typing import Any, cast

import yaml
from kubernetes.client import CoreV1Api, CustomObjectsApi
from kubernetes.config import new_client_from_config

from ddp_api.pods import LABEL_JOB
from ddp_devcluster.harness import EXAMPLES
from ddp_devcluster.kind.stack import KindStack
from ddp_devcluster.kueue import API, queue_objects

HOLD = 25


def _true(wl: dict[str, Any], ctype: str) -> bool:
    conds = (wl.get("status") or {}).get("conditions") or []
    return any(c["type"] == ctype and c["status"] == "True" for c in conds)


def one_round(s: KindStack) -> dict[str, float]:
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    s.kubectl("create", "namespace", ns, ns="")
    quota = {"cpu": "1", "memory": "8Gi"}  # one digits job (2 nodes x 500m)
    s.apply(*queue_objects(ns, "team", ns, ns, quota), ns="")
    for name, value in (("ddp-low", 100), ("ddp-high", 1000)):
        s.kubectl("create", "priorityclass", name, f"--value={value}", ns="", check=False)
    docs = [
        d for d in yaml.safe_load_all((EXAMPLES / "checkpoint-pvc-shared.yaml").read_text()) if d
    ]
    s.kubectl("apply", "-f", "-", ns=ns, input=yaml.safe_dump_all(docs))
    digits = yaml.safe_load((EXAMPLES / "digits.yaml").read_text())

    def job(name: str, priority: str, claim: str, hold: list[int]) -> str:
        d = json.loads(json.dumps(digits))
        d["metadata"] = {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "team"}}
        d["spec"]["template"] = {"priorityClassName": priority}
        d["spec"]["trainer"]["holdAtSteps"] = hold
        d["spec"]["checkpoint"]["volume"]["persistentVolumeClaim"]["claimName"] = claim
        return yaml.safe_dump(d)

    s.kubectl("apply", "-f", "-", ns=ns, input=job("low", "ddp-low", "digits-checkpoints", [HOLD]))
    s.held("low", HOLD, 300, ns=ns)

    ckpt = s.claim_dir("digits-checkpoints", ns=ns) / f"step-{HOLD:08d}.pt"
    assert not ckpt.exists()
    s.kubectl("apply", "-f", "-", ns=ns, input=job("high", "ddp-high", "charlm-checkpoints", []))
    # Polled every 50 ms through one API client (a kubectl per poll would take longer than that).
    api = new_client_from_config(str(s.kubeconfig))
    group, version = API.split("/")

    def workloads() -> list[dict[str, Any]]:
        out = CustomObjectsApi(api).list_namespaced_custom_object(group, version, ns, "workloads")
        return list(cast(dict[str, Any], out)["items"])

    def low_pods() -> list[Any]:
        return list(CoreV1Api(api).list_namespaced_pod(ns, label_selector=f"{LABEL_JOB}=low").items)

    evicted = gone = high = 0.0
    deadline = time.monotonic() + 300
    while not (gone and high):
        now = time.monotonic()
        if now > deadline:
            raise TimeoutError(s.diagnostics(ns))
        wls = {w["metadata"]["labels"][LABEL_JOB]: w for w in workloads()}
        if not evicted and "low" in wls and _true(wls["low"], "Evicted"):
            evicted = now
        if evicted and not gone and not low_pods() and ckpt.exists():
            gone = now
        if evicted and not high and "high" in wls and _true(wls["high"], "Admitted"):
            high = now
        time.sleep(0.05)
    api.close()
    s.kubectl("delete", "namespace", ns, "--wait=false", ns="")
    s.kubectl("delete", "clusterqueue", ns, "--wait=false", ns="", check=False)
    return {"evicted_to_pods_gone_s": gone - evicted, "evicted_to_high_admitted_s": high - evicted}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    rounds = []
    with KindStack(kueue=True, log=log) as s:
        for i in range(args.rounds):
            r = one_round(s)
            log(f"round {i + 1}/{args.rounds}: {r}")
            rounds.append(r)

    def med(key: str) -> float:
        return round(statistics.median(r[key] for r in rounds), 2)

    print(
        json.dumps(
            {
                "rounds": args.rounds,
                "evicted_to_pods_gone_s_median": med("evicted_to_pods_gone_s"),
                "evicted_to_high_admitted_s_median": med("evicted_to_high_admitted_s"),
                "evicted_to_pods_gone_s": [round(r["evicted_to_pods_gone_s"], 2) for r in rounds],
            }
        )
    )


if __name__ == "__main__":
    main()
