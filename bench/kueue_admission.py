"""How fast a queued DDPJob starts once Kueue admits it, against the embedded plane with kwok
nodes and real Kueue (the pinned build).

Prints one JSON object::

    python bench/kueue_admission.py [--jobs 20] [--nodes-per-job 2]

Jobs are applied one at a time into a ClusterQueue with quota for one job, so each job waits
Queued behind the previous one, which is then ended (kwok exit code 0):

- ``admission_to_pods_p50_ms``: from the moment a watch sees the job's Workload Admitted until
  a watch on the namespace has seen every pod of the job (workers and store);
- ``finish_to_next_admitted_p50_ms``: from the previous job's Succeeded (seen by a watch)
  until the next job's Workload is Admitted: the operator finishing the Workload and Kueue
  admitting the next one.

Both clocks are this process's, on events from watches, so the API server's delivery counts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import kubernetes
import yaml

from ddp_api.contract import API_VERSION, GROUP, KIND, PLURAL, VERSION
from ddp_api.pods import LABEL_JOB
from ddp_devcluster.kueue import API, KueueProcess, operator_rbac
from ddp_devcluster.operator_process import NAMESPACE, OperatorProcess, install
from ddp_devcluster.plane import ControlPlane
from ddp_devcluster.polling import until

RELEASE = "ddp-kueue"
NS = "bench"


class Seen:
    """When (time.monotonic) watches first saw: each Workload Admitted, each pod, each job
    Succeeded."""

    def __init__(self, api: kubernetes.client.ApiClient):
        self.api = api
        self.admitted: dict[str, float] = {}  # job -> t
        self.pods: dict[str, float] = {}  # pod -> t
        self.succeeded: dict[str, float] = {}  # job -> t
        self.stop = threading.Event()
        custom, core = kubernetes.client.CustomObjectsApi(api), kubernetes.client.CoreV1Api(api)
        self.threads = [
            threading.Thread(target=self._watch, args=(w,), daemon=True)
            for w in (
                lambda **kw: custom.list_namespaced_custom_object(
                    "kueue.x-k8s.io", "v1beta2", NS, "workloads", **kw
                ),
                lambda **kw: core.list_namespaced_pod(NS, **kw),
                lambda **kw: custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, **kw),
            )
        ]
        for t in self.threads:
            t.start()

    def last_of(self, pods: list[str]) -> float | None:
        """When the last of ``pods`` was seen; None while one is missing."""
        times = [self.pods.get(p) for p in pods]
        return None if None in times else max(t for t in times if t is not None)

    def _watch(self, lister: Any) -> None:
        while not self.stop.is_set():
            w = kubernetes.watch.Watch()
            try:
                for ev in w.stream(lister, timeout_seconds=60):
                    obj = ev["object"]
                    if not isinstance(obj, dict):
                        obj = self.api.sanitize_for_serialization(obj)
                    self._saw(obj, time.monotonic())
                    if self.stop.is_set():
                        w.stop()
            except Exception:  # the plane going away at the end; otherwise watch again
                if self.stop.is_set():
                    return

    def _saw(self, obj: dict[str, Any], now: float) -> None:
        kind, meta = obj.get("kind"), obj.get("metadata") or {}
        job = (meta.get("labels") or {}).get(LABEL_JOB, "")
        status = obj.get("status") or {}
        if kind == "Workload":
            if any(
                c["type"] == "Admitted" and c["status"] == "True"
                for c in status.get("conditions") or []
            ):
                self.admitted.setdefault(job, now)
        elif kind == KIND:
            if status.get("phase") == "Succeeded":
                self.succeeded.setdefault(meta["name"], now)
        else:
            self.pods.setdefault(meta["name"], now)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--nodes-per-job", type=int, default=2)
    args = ap.parse_args()
    n = args.nodes_per_job

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory() as tmp, ControlPlane(nodes=2, log=log) as cp:
        install(cp)
        kueue = KueueProcess(cp, Path(tmp) / "kueue").start()
        log(f"kueue ready in {kueue.startup_s:.1f}s")
        for doc in operator_rbac(RELEASE, NAMESPACE):
            cp.kubectl("apply", "-f", "-", input=json.dumps(doc))
        op = OperatorProcess(
            cp,
            Path(tmp) / "op",
            env={"DDP_KUEUE": "true", "DDP_LEASE_NAME": RELEASE},
            service_account=RELEASE,
        ).start()
        try:
            cp.kubectl("create", "namespace", NS)
            queues = [
                {"kind": "ResourceFlavor", "metadata": {"name": "bench"}},
                {
                    "kind": "ClusterQueue",
                    "metadata": {"name": "bench"},
                    "spec": {
                        "namespaceSelector": {},
                        "resourceGroups": [
                            {
                                "coveredResources": ["cpu"],
                                "flavors": [
                                    {
                                        "name": "bench",
                                        "resources": [{"name": "cpu", "nominalQuota": n}],
                                    }
                                ],
                            }
                        ],
                    },
                },
                {
                    "kind": "LocalQueue",
                    "metadata": {"name": "lq", "namespace": NS},
                    "spec": {"clusterQueue": "bench"},
                },
            ]
            for q in queues:
                cp.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": API, **q}))
            api = kubernetes.config.new_client_from_config(str(cp.kubeconfig))
            seen = Seen(api)
            time.sleep(1)
            to_pods, to_next = [], []
            previous = ""
            for i in range(args.jobs):
                name = f"b{i:03d}"
                job = {
                    "apiVersion": API_VERSION,
                    "kind": KIND,
                    "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
                    "spec": {"nodes": n, "resources": {"requests": {"cpu": "1"}}},
                }
                cp.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump(job))
                if previous:  # end the previous job now that this one waits behind it
                    for k in range(n):
                        cp.kubectl(
                            "annotate", "-n", NS, "pod", f"{previous}-node-{k}",
                            "kwok.ddp.dev/exit-code=0",
                        )  # fmt: skip
                pods = [f"{name}-node-{k}" for k in range(n)] + [f"{name}-rdzv"]
                admitted = until(f"{name} admitted", partial(seen.admitted.get, name), 120)
                last = until(f"{name}'s pods", partial(seen.last_of, pods), 120)
                to_pods.append((last - admitted) * 1000)
                if previous:
                    done = until(f"{previous} Succeeded", partial(seen.succeeded.get, previous))
                    to_next.append((admitted - done) * 1000)
                log(f"{name}: admitted -> pods {to_pods[-1]:.0f} ms")
                previous = name
            seen.stop.set()
        finally:
            op.stop()
            kueue.stop()
    print(
        json.dumps(
            {
                "jobs": args.jobs,
                "nodes_per_job": n,
                "admission_to_pods_p50_ms": round(statistics.median(to_pods), 1),
                "admission_to_pods_max_ms": round(max(to_pods), 1),
                "finish_to_next_admitted_p50_ms": round(statistics.median(to_next), 1)
                if to_next
                else None,
            }
        )
    )


if __name__ == "__main__":
    main()
