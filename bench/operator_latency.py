"""How fast the operator turns DDPJobs into pods, against the embedded plane with kwok nodes.

Prints one JSON object and writes a latency histogram PNG::

    python bench/operator_latency.py [--jobs 20] [--burst-jobs 100] [--nodes-per-job 8]
                                     [--rounds 3] [--plot out/operator_latency.png]
                                     [--own-command]

- ``single_job_p50_ms``: apply of one job until all its pods (workers and store) exist, one
  job at a time; ``single_job_watch_p50_ms``: until a watch on the namespace has seen them.
- ``burst_operator_s``: ``burst_jobs`` jobs created at once until every pod of them exists.
- ``burst_direct_s``: the same pods and Services (rendered by the operator's own renderer)
  created by a concurrent client with as many threads as the operator has connections, under
  the operator's ServiceAccount (so the API server's priority and fairness treats both alike):
  the limit of this API server on this machine. The operator is stopped meanwhile.
- ``operator_over_direct_ratio``: the median over ``rounds`` rounds of the two bursts' ratio.
  A round runs both bursts in fresh namespaces (in alternating order, so neither always goes
  first) and deletes them after; ``burst_operator_s`` and ``burst_direct_s`` are medians too,
  ``burst_ratios`` each round's ratio. One burst on two shared cores varies by a third from
  run to run, which one round per run cannot tell from a change in the operator.
- ``operator_peak_rss_mb``: the operator process's peak resident memory over the whole run.

The jobs run the bundled trainer, whose pods run as their namespace's trainer account (a
ServiceAccount and a RoleBinding, made at the namespace's first job; the admission policy that
confines it comes with the manifests); ``--own-command`` makes them run a command of the user's
instead (``spec.command``), whose pods hold no credential: the operator's work per job without
the trainer's account.

"Exists" is when the API server answered the pod's create, read from its audit log, so that a
watcher falling behind under load cannot skew a figure; the clock starts just before the job's
create is sent. The watch figure adds the API server's watch delivery.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import kubernetes
from kubernetes.client.rest import ApiException

from ddp_api.contract import API_VERSION, GROUP, KIND, PLURAL, VERSION
from ddp_api.ddpjob import DDPJob
from ddp_devcluster.operator_process import NAMESPACE, SERVICE_ACCOUNT, OperatorProcess, install
from ddp_devcluster.plane import ControlPlane
from ddp_operator import render
from ddp_operator.kube import retry_delay_s

WORKERS = 48  # the operator's DDP_WORKERS default, and the direct client's threads


class PodWatch:
    """Records when each pod name first appears in a namespace."""

    def __init__(self, api: kubernetes.client.ApiClient, namespace: str):
        self.seen: dict[str, float] = {}
        self.cond = threading.Condition()
        self._stop = False
        self._core = kubernetes.client.CoreV1Api(api)
        self._ns = namespace
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            # Raw JSON, not the client's model objects: deserializing every event into a V1Pod
            # took longer than the operator took to create the pods.
            try:
                r: Any = self._core.list_namespaced_pod(
                    self._ns, watch=True, timeout_seconds=5, _preload_content=False
                )
                rest = b""
                for chunk in r.stream(65536):
                    *lines, rest = (rest + chunk).split(b"\n")
                    for line in lines:
                        event = json.loads(line)
                        if event["type"] == "ERROR":
                            # Under load the API server's watch cache can lag the version a
                            # watch asks for (504): start over, which replays every pod.
                            raise RuntimeError(event["object"].get("message"))
                        with self.cond:
                            name = event["object"]["metadata"]["name"]
                            self.seen.setdefault(name, time.perf_counter())
                            self.cond.notify_all()
                    if self._stop:
                        break
                r.release_conn()
            except (ApiException, RuntimeError) as e:
                print(f"pod watch of {self._ns}: {e}; watching again", file=sys.stderr, flush=True)
                time.sleep(0.2)

    def wait_for(self, names: set[str], timeout_s: float = 300) -> float:
        """The time the last of ``names`` appeared."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while not names <= self.seen.keys():
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(names - self.seen.keys())[:5]
                    raise TimeoutError(f"{len(names - self.seen.keys())} pods missing: {missing}")
                self.cond.wait(left)
            return max(self.seen[n] for n in names)

    def stop(self) -> None:
        self._stop = True


def created_at(audit_log: Path, namespace: str, names: set[str]) -> dict[str, float]:
    """When the API server answered each successful create of these pods (its audit log,
    wall clock): free of any watcher's delays. Waits for the log to have them all: the API
    server writes its records a moment after it answers."""
    deadline = time.monotonic() + 30
    while len(out := _created_at(audit_log, namespace, names)) < len(names):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(names) - len(out)} pod creates missing from the audit log")
        time.sleep(0.5)
    return out


def _created_at(audit_log: Path, namespace: str, names: set[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in audit_log.read_text().splitlines():
        r = json.loads(line)
        ref = r.get("objectRef") or {}
        if (
            r.get("verb") == "create"
            and ref.get("resource") == "pods"
            and ref.get("namespace") == namespace
            and ref.get("name") in names
            and r.get("responseStatus", {}).get("code") == 201
        ):
            stamp = r["stageTimestamp"].replace("Z", "+00:00")
            out[ref["name"]] = dt.datetime.fromisoformat(stamp).timestamp()
    return out


def requests_by(audit_log: Path, user: str, start: float, end: float) -> dict[str, int]:
    """How many requests ``user`` made between two wall-clock times, by verb and resource."""
    out: dict[str, int] = {}
    for line in audit_log.read_text().splitlines():
        r = json.loads(line)
        when = dt.datetime.fromisoformat(r["requestReceivedTimestamp"].replace("Z", "+00:00"))
        if r["user"]["username"] == user and start <= when.timestamp() <= end:
            ref = r.get("objectRef") or {}
            what = ref.get("resource", "") + (
                f"/{ref['subresource']}" if ref.get("subresource") else ""
            )
            key = f"{r['verb']} {what}"
            out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def job_body(name: str, nodes: int, own_command: bool = False) -> dict[str, Any]:
    runs = (
        {"command": ["python", "train.py"]} if own_command else {"trainer": {"workload": "digits"}}
    )
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {"nodes": nodes, **runs, "checkpoint": {"volume": {"emptyDir": {}}}},
    }


def pod_names(job: str, nodes: int) -> set[str]:
    return {render.store_name(job)} | {render.worker_name(job, i) for i in range(nodes)}


def create_job(
    api: kubernetes.client.ApiClient, ns: str, name: str, nodes: int, own_command: bool = False
) -> None:
    kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, job_body(name, nodes, own_command)
    )


def direct_objects(ns: str, jobs: list[str], nodes: int, own_command: bool) -> list[dict[str, Any]]:
    """What the operator would create for these jobs, without owners (none exist): the
    namespace's trainer account and its RoleBinding once, then each job's Services and pods."""
    cfg = render.OperatorConfig(default_image="trainer:bench")
    out = [] if own_command else render.render_namespace_trainer(ns)
    for i, name in enumerate(jobs):
        body = job_body(name, nodes, own_command)
        body["metadata"].update({"namespace": ns, "uid": f"bench-{i}", "generation": 1})
        job = DDPJob.model_validate(body)
        objs = [
            *render.render_services(job),
            render.render_store(job, cfg),
            *(render.render_worker(job, n, 0, cfg) for n in range(nodes)),
        ]
        for o in objs:
            del o["metadata"]["ownerReferences"]
        out += objs
    return out


def create_direct(api: kubernetes.client.ApiClient, ns: str, obj: dict[str, Any]) -> None:
    core = kubernetes.client.CoreV1Api(api)
    rbac = kubernetes.client.RbacAuthorizationV1Api(api)
    body: Any = obj
    creates: dict[str, Callable[..., Any]] = {
        "Service": core.create_namespaced_service,
        "ServiceAccount": core.create_namespaced_service_account,
        "ConfigMap": core.create_namespaced_config_map,
        "Role": rbac.create_namespaced_role,
        "RoleBinding": rbac.create_namespaced_role_binding,
        "Pod": core.create_namespaced_pod,
    }
    create = creates[obj["kind"]]
    for attempt in range(1, 7):
        try:
            create(ns, body)
            return
        except ApiException as e:
            if e.status == 409:
                return
            if e.status != 429 or attempt == 6:  # retried as the operator retries
                raise
            time.sleep(retry_delay_s(attempt, (e.headers or {}).get("Retry-After")))


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RssSampler:
    def __init__(self, pid: Callable[[], int | None]):
        self.peak_kb = 0
        self._pid = pid
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            pid = self._pid()
            if pid:
                try:
                    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                        if line.startswith("VmRSS:"):
                            self.peak_kb = max(self.peak_kb, int(line.split()[1]))
                except OSError:
                    pass
            time.sleep(0.05)

    def stop(self) -> float:
        self._stop = True
        return self.peak_kb / 1024


def plot(latencies_ms: list[float], burst: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.hist(latencies_ms, bins=20, color="#3b75af")
    a.axvline(statistics.median(latencies_ms), color="k", ls="--", label="p50")
    a.set_xlabel("apply -> all pods exist (ms)")
    a.set_ylabel("jobs")
    a.set_title(f"one job at a time ({len(latencies_ms)} jobs)")
    a.legend()
    for label, times in burst.items():
        b.plot(sorted(times), range(1, len(times) + 1), label=label)
    b.set_xlabel("seconds since the burst started")
    b.set_ylabel("pods existing")
    b.set_title("burst")
    b.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20, help="jobs of the one-at-a-time phase")
    ap.add_argument("--burst-jobs", type=int, default=100)
    ap.add_argument("--nodes-per-job", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3, help="burst rounds (operator and direct)")
    ap.add_argument("--plot", type=Path, default=Path("out/operator_latency.png"))
    ap.add_argument(
        "--own-command",
        action="store_true",
        help="jobs run a command of the user's (spec.command), not the bundled trainer",
    )
    args = ap.parse_args()
    n, own = args.nodes_per_job, args.own_command
    kwok_nodes = max(2, (args.burst_jobs * (n + 1)) // 100 + 1)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    with ControlPlane(nodes=kwok_nodes, log=log) as cp, tempfile.TemporaryDirectory() as tmp:
        install(cp)
        api = kubernetes.config.new_client_from_config(str(cp.kubeconfig))
        api.configuration.connection_pool_maxsize = WORKERS
        cp.kubectl("create", "namespace", "single")
        op = OperatorProcess(cp, Path(tmp), env={"DDP_WORKERS": str(WORKERS)})
        op.start()
        rss = RssSampler(lambda: op.pid() if op.process and op.process.alive() else None)

        # One job at a time.
        watch = PodWatch(api, "single")
        watched: list[float] = []
        started: dict[str, float] = {}
        for i in range(args.jobs):
            name = f"single-{i}"
            started[name], t0 = time.time(), time.perf_counter()
            create_job(api, "single", name, n, own)
            watched.append((watch.wait_for(pod_names(name, n)) - t0) * 1000)
            log(f"single job {i + 1}/{args.jobs}: seen by a watch after {watched[-1]:.0f} ms")
        watch.stop()
        single = created_at(
            cp.audit_log, "single", set().union(*map(pod_names, started, [n] * args.jobs))
        )
        latencies = [
            (max(single[p] for p in pod_names(name, n)) - t0) * 1000 for name, t0 in started.items()
        ]

        # The bursts: rounds of one through the operator and one straight from a client, in
        # alternating order, each round in fresh namespaces that are deleted afterwards.
        jobs = [f"burst-{i}" for i in range(args.burst_jobs)]
        want = set().union(*(pod_names(j, n) for j in jobs))
        token = cp.token_kubeconfig(NAMESPACE, SERVICE_ACCOUNT, Path(tmp) / "direct.kubeconfig")
        as_operator = kubernetes.config.new_client_from_config(str(token))
        as_operator.configuration.connection_pool_maxsize = WORKERS
        rounds: list[dict[str, Any]] = []
        for r in range(args.rounds):
            ns_op, ns_direct = f"burst-operator-{r}", f"burst-direct-{r}"
            for ns in (ns_op, ns_direct):
                cp.kubectl("create", "namespace", ns)
            result: dict[str, Any] = {}
            for side in ("operator", "direct") if r % 2 == 0 else ("direct", "operator"):
                if side == "operator":
                    if not op.process or not op.process.alive():
                        op.start()
                    result.update(operator_burst(cp, api, op, ns_op, jobs, n, own, want, log))
                    op.stop()  # the direct client runs alone
                else:
                    result.update(direct_burst(cp, api, as_operator, ns_direct, jobs, n, own, want))
            result["ratio"] = result["operator_s"] / result["direct_s"]
            rounds.append(result)
            log(
                f"round {r + 1}/{args.rounds}: {len(want)} pods through the operator in "
                f"{result['operator_s']:.2f} s, directly in {result['direct_s']:.2f} s"
            )
            cp.kubectl("delete", "namespace", ns_op, ns_direct, "--timeout=300s")
        peak = rss.stop()

    def median(key: str) -> float:
        return statistics.median(x[key] for x in rounds)

    latencies.sort()
    watched.sort()
    middle = sorted(rounds, key=lambda x: x["ratio"])[(len(rounds) - 1) // 2]
    summary = {
        "single_job_p50_ms": round(statistics.median(latencies), 1),
        "single_job_p90_ms": round(latencies[int(0.9 * (len(latencies) - 1))], 1),
        "single_job_max_ms": round(max(latencies), 1),
        "single_job_watch_p50_ms": round(statistics.median(watched), 1),
        "single_jobs": args.jobs,
        "own_command": own,
        "burst_jobs": args.burst_jobs,
        "burst_nodes_per_job": n,
        "burst_pods": len(want),
        "burst_rounds": args.rounds,
        "burst_operator_s": round(median("operator_s"), 2),
        "burst_direct_s": round(median("direct_s"), 2),
        "operator_over_direct_ratio": round(median("ratio"), 3),
        "burst_ratios": [round(x["ratio"], 3) for x in rounds],
        "burst_apply_s": round(median("apply_s"), 2),
        "burst_operator_cpu_s": round(median("cpu_s"), 2),
        "burst_operator_requests": middle["requests"],
        "operator_peak_rss_mb": round(peak, 1),
        "operator_workers": WORKERS,
        "kwok_nodes": kwok_nodes,
        "plot": str(args.plot),
    }
    plot(
        latencies,
        {"operator": middle["op_times"], "direct client": middle["direct_times"]},
        args.plot,
    )
    print(json.dumps(summary))


def operator_burst(
    cp: ControlPlane,
    api: kubernetes.client.ApiClient,
    op: OperatorProcess,
    ns: str,
    jobs: list[str],
    n: int,
    own_command: bool,
    want: set[str],
    log: Callable[[str], None],
) -> dict[str, Any]:
    """``jobs`` created at once; the operator creates their Services and pods."""
    watch = PodWatch(api, ns)
    cpu0 = cpu_s(op.pid())
    t0 = time.time()
    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(lambda j: create_job(api, ns, j, n, own_command), jobs))
    applied_s = time.time() - t0
    try:
        watch.wait_for(want)
    except TimeoutError:
        log(f"the operator's log ends:\n{op.tail(40)}")
        raise
    cpu = cpu_s(op.pid()) - cpu0
    watch.stop()
    times = [t - t0 for t in created_at(cp.audit_log, ns, want).values()]
    user = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
    return {
        "operator_s": max(times),
        "op_times": times,
        "apply_s": applied_s,
        "cpu_s": cpu,
        "requests": requests_by(cp.audit_log, user, t0, t0 + max(times)),
    }


def direct_burst(
    cp: ControlPlane,
    api: kubernetes.client.ApiClient,
    as_operator: kubernetes.client.ApiClient,
    ns: str,
    jobs: list[str],
    n: int,
    own_command: bool,
    want: set[str],
) -> dict[str, Any]:
    """The same objects straight from a concurrent client, as the operator's ServiceAccount
    (the same API priority and fairness class), in the order the operator needs: the
    namespace's trainer ServiceAccount (admission requires it) before the pods and RoleBinding."""
    objs = direct_objects(ns, jobs, n, own_command)
    first = [o for o in objs if o["kind"] == "ServiceAccount"]
    then = [o for o in objs if o["kind"] != "ServiceAccount"]
    watch = PodWatch(api, ns)
    t0 = time.time()
    with ThreadPoolExecutor(WORKERS) as pool:
        for wave in (first, then):
            list(pool.map(lambda o: create_direct(as_operator, ns, o), wave))
    watch.wait_for(want)
    watch.stop()
    times = [t - t0 for t in created_at(cp.audit_log, ns, want).values()]
    return {"direct_s": max(times), "direct_times": times}


if __name__ == "__main__":
    main()
