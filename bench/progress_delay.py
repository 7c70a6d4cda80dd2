"""How long rank 0's progress takes to reach a DDPJob's status, against the embedded plane.

Prints one JSON object (its last line) and writes a histogram PNG::

    python bench/progress_delay.py [--rounds 40] [--plot out/progress_delay.png]

One job runs on kwok nodes under the operator (as its own process, with the chart's RBAC). Each
round sends one progress record and times it until a watch on the job sees that step in
``status.progress``:

- ``pod_p50_ms`` (the path now): rank 0's client, with a token of the namespace's trainer
  account bound to rank 0's pod (as the kubelet mounts it), patches that pod's annotation
  ``ddp.dev/progress`` (the admission policy checks it is its own pod and nothing else
  changed); the operator sees the change in its pod watch, validates the record and writes the
  status. (Until issue 41 rank 0 patched a ConfigMap of its job, the same way: p50 30 ms.)
- ``direct_p50_ms`` (the path of release 0.1.0, for comparison): the same record merge-patched
  straight into the status subresource, as rank 0 used to do.

Both sides are timed the same way, from just before the request is sent until the watch event
arrives, one round of each alternately, so the machine's load falls on both alike.
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import kubernetes

from ddp_api.contract import API_VERSION, GROUP, KIND, PLURAL, VERSION
from ddp_devcluster.operator_process import OperatorProcess, install
from ddp_devcluster.plane import ControlPlane
from ddp_devcluster.polling import until
from ddp_operator import render
from ddp_trainer.reporting.progress import InClusterProgressWriter, progress_record

NS, JOB = "bench", "reporter"


def record(step: int) -> dict[str, Any]:
    return progress_record(
        epoch=0, step=step, total_steps=10_000, loss=1.0 / step, samples_per_second=100.0,
        last_checkpoint=None, world_size=2, now=time.time(),
    )  # fmt: skip


class StepWatch:
    """Puts (step, monotonic time) on a queue for each status.progress.step a watch sees."""

    def __init__(self, api: kubernetes.client.ApiClient):
        self.seen: queue.Queue[tuple[int, float]] = queue.Queue()
        self._custom = kubernetes.client.CustomObjectsApi(api)
        self._stop = False
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        last = None
        while not self._stop:
            stream = kubernetes.watch.Watch().stream(
                self._custom.list_namespaced_custom_object, GROUP, VERSION, NS, PLURAL,
                field_selector=f"metadata.name={JOB}", timeout_seconds=10,
            )  # fmt: skip
            try:
                for event in stream:
                    progress = (event["object"].get("status") or {}).get("progress") or {}
                    step = progress.get("step")
                    if step is not None and step != last:
                        last = step
                        self.seen.put((step, time.monotonic()))
            except Exception:  # the server ended the watch (or is stopping): watch again
                time.sleep(0.1)

    def wait(self, step: int, timeout_s: float = 30) -> float:
        deadline = time.monotonic() + timeout_s
        while True:
            seen, at = self.seen.get(timeout=max(0.0, deadline - time.monotonic()))
            if seen == step:
                return at


def pctl(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=40, help="records sent down each path")
    ap.add_argument("--plot", type=Path, default=Path("out/progress_delay.png"))
    args = ap.parse_args()

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    with ControlPlane(nodes=2, log=log) as cp, tempfile.TemporaryDirectory() as tmp:
        install(cp)
        api = kubernetes.config.new_client_from_config(str(cp.kubeconfig))
        custom = kubernetes.client.CustomObjectsApi(api)
        cp.kubectl("create", "namespace", NS)
        with OperatorProcess(cp, Path(tmp)):
            job = {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "metadata": {"name": JOB},
                "spec": {"nodes": 2, "checkpoint": {"volume": {"emptyDir": {}}}},
            }
            custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, job)
            pod = f"{JOB}-node-0"
            token = until(
                "a token bound to rank 0's pod",
                lambda: _bound_token(cp, pod),
                60,
            )
            sa = Path(tmp) / "sa"
            sa.mkdir()
            (sa / "token").write_text(token)
            (sa / "ca.crt").write_bytes(cp.ca_file.read_bytes())
            host, port = urllib.parse.urlsplit(cp.server).netloc.rsplit(":", 1)
            rank0 = InClusterProgressWriter(host, port, sa, pod=pod)
            until("the namespace's grant", lambda: _try(rank0, 1), 60)
            watch = StepWatch(api)
            watch.wait(1)
            delays: dict[str, list[float]] = {"pod": [], "direct": []}
            step = 1
            for i in range(args.rounds):
                for path in ("pod", "direct") if i % 2 else ("direct", "pod"):
                    step += 1
                    t0 = time.monotonic()
                    if path == "pod":
                        rank0.patch_progress(NS, JOB, record(step))
                    else:
                        custom.patch_namespaced_custom_object_status(
                            GROUP, VERSION, NS, PLURAL, JOB, {"status": {"progress": record(step)}}
                        )
                    delays[path].append((watch.wait(step) - t0) * 1000)
                log(
                    f"round {i + 1}/{args.rounds}: pod {delays['pod'][-1]:.1f} ms,"
                    f" direct {delays['direct'][-1]:.1f} ms"
                )
    result: dict[str, Any] = {"rounds": args.rounds}
    for path, values in delays.items():
        result[f"{path}_p50_ms"] = round(statistics.median(values), 1)
        result[f"{path}_p90_ms"] = round(pctl(values, 0.9), 1)
        result[f"{path}_max_ms"] = round(max(values), 1)
    plot(delays, args.plot)
    result["plot"] = str(args.plot)
    print(json.dumps(result))


def _bound_token(cp: ControlPlane, pod: str) -> str | None:
    """A token of the namespace's trainer account bound to ``pod``, once both exist."""
    got = cp.kubectl("get", "pod", pod, "-n", NS, "-o", "jsonpath={.metadata.uid}", check=False)
    if got.returncode != 0 or not got.stdout.strip():
        return None
    made = cp.kubectl(
        "create", "token", render.PROGRESS_ACCOUNT, "-n", NS, "--bound-object-kind=Pod",
        f"--bound-object-name={pod}", f"--bound-object-uid={got.stdout.strip()}", check=False,
    )  # fmt: skip
    return made.stdout.strip() or None


def _try(client: InClusterProgressWriter, step: int) -> bool | None:
    try:
        client.patch_progress(NS, JOB, record(step))
    except Exception:
        return None
    return True


def plot(delays: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    top = max(max(v) for v in delays.values())
    bins = [top * i / 40 for i in range(41)]
    labels = {
        "pod": "rank 0's pod annotation -> operator -> status (now)",
        "direct": "status patched by the pod (0.1.0)",
    }
    for name, values in delays.items():
        ax.hist(
            values,
            bins=bins,
            alpha=0.6,
            label=f"{labels[name]}: p50 {statistics.median(values):.0f} ms",
        )
    ax.set_xlabel("rank 0 sends a step -> a watch sees it in status.progress (ms)")
    ax.set_ylabel("reports")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
