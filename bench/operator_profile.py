"""Where the operator's time per job goes: the one-at-a-time phase of
``bench/operator_latency.py`` with the operator (``kopf run``, as its own process) under
cProfile, and the operator's API requests per job from the API server's audit log::

    python bench/operator_profile.py [--jobs 20] [--nodes-per-job 8] [--out out/profile]
                                     [--top 40] [--functions a,b] [--no-profile]
                                     [--pause-s 0] [--own-command]

Writes ``OUT/operator.prof`` (``python -m pstats``), ``OUT/audit.log`` and ``OUT/sent.json``
(when each job's create was sent), prints to stderr the functions with the most cumulative time
and to stdout one JSON object: the operator's requests per job by verb and resource, its CPU
and reconciles per job (the latter from its own metrics), the medians over the jobs of when
the API server received and answered the first request of each kind for a job (ms after the
job's create was sent), the control plane's CPU per job by process (kube-apiserver, etcd, the
controllers, kwok), its garbage collections, and per job the cumulative ms of the functions
named in ``--functions``. ``--no-profile`` runs the operator as the latency benchmark does and
prints only the requests, CPU, reconciles, the control plane's CPU and the timeline.

cProfile runs on a CPU clock (time the operator waited for a core is not counted) and only in
the operator's main thread (the event loop), where kopf and the controller run. It counts a
coroutine's time only while it runs (each resumption is a call), so a reconcile's figure is the
operator's own time for it, without the API server's answers. The profiler slows the operator
down, so compare its figures only with each other, at two commits, not with the benchmark's.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import pstats
import shutil
import signal
import stat
import statistics
import sys
import tempfile
import time
from pathlib import Path

import kubernetes

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ddp_devcluster.operator_process import NAMESPACE, SERVICE_ACCOUNT, OperatorProcess, install
from ddp_devcluster.plane import ControlPlane
from ddp_devcluster.prometheus import scrape
from operator_latency import PodWatch, cpu_s, create_job, pod_names, requests_by

RECONCILES = "ddp_operator_reconcile_duration_seconds_count"  # in the operator's metrics

# The operator under cProfile with a CPU-time clock (its main thread's: time the process spent
# waiting for a core on this shared machine is not counted), and what its garbage collections
# and the whole process used, written when kopf exits.
PROFILED = """
import cProfile, gc, json, os, runpy, sys, time
gcs = {{"collections": [0, 0, 0], "cpu_s": 0.0}}
start = [0.0]
def on_gc(phase, info):
    if phase == "start":
        start[0] = time.thread_time()
    else:
        gcs["collections"][info["generation"]] += 1
        gcs["cpu_s"] += time.thread_time() - start[0]
gc.callbacks.append(on_gc)
prof = cProfile.Profile(time.thread_time)
sys.argv = ["kopf", *sys.argv[3:]]  # after "-m kopf"
prof.enable()
try:
    runpy.run_module("kopf", run_name="__main__", alter_sys=True)
finally:
    prof.disable()
    prof.dump_stats({out!r})
    t = os.times()
    gcs["process_cpu_s"] = t.user + t.system
    with open({out!r} + ".json", "w") as f:
        json.dump(gcs, f)
"""

FUNCTIONS = "reconcile,run,plan,model_validate,write_status,ensure,_create,event,jobs_by_name"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--nodes-per-job", type=int, default=8)
    ap.add_argument("--out", type=Path, default=Path("out/profile"))
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--functions", default=FUNCTIONS, help="comma-separated function names")
    ap.add_argument(
        "--no-profile",
        action="store_true",
        help="the operator without cProfile: only the requests and their timeline",
    )
    ap.add_argument(
        "--pause-s",
        type=float,
        default=0.0,
        help="seconds between one job's pods seen and the next job's create (0: at once, as "
        "operator_latency.py does); a pause longer than what a job's start sets off (status "
        "writes, kwok starting its pods, the trainer's objects) measures each job alone",
    )
    ap.add_argument(
        "--own-command",
        action="store_true",
        help="jobs run a command of the user's (spec.command): no trainer account, no progress",
    )
    args = ap.parse_args()
    n = args.nodes_per_job
    args.out.mkdir(parents=True, exist_ok=True)
    prof = (args.out / "operator.prof").resolve()
    prof.unlink(missing_ok=True)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    with ControlPlane(nodes=2, log=log) as cp, tempfile.TemporaryDirectory() as tmp:
        install(cp)
        api = kubernetes.config.new_client_from_config(str(cp.kubeconfig))
        cp.kubectl("create", "namespace", "single")
        # OperatorProcess runs ``sys.executable -m kopf run ...``: run that under cProfile.
        wrapper = Path(tmp) / "python-cprofile"
        (Path(tmp) / "profiled.py").write_text(PROFILED.format(out=str(prof)))
        wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {Path(tmp) / "profiled.py"} "$@"\n')
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
        real = sys.executable
        if not args.no_profile:
            sys.executable = str(wrapper)
        try:
            op = OperatorProcess(cp, Path(tmp), env={"DDP_WORKERS": "48"}).start()
        finally:
            sys.executable = real
        watch = PodWatch(api, "single")
        plane0 = plane_cpu_s(cp)
        cpu0, start = cpu_s(op.pid()), time.time()
        sent: dict[str, float] = {}
        for i in range(args.jobs):
            name = f"single-{i}"
            sent[name], t0 = time.time(), time.perf_counter()
            create_job(api, "single", name, n, args.own_command)
            ms = (watch.wait_for(pod_names(name, n)) - t0) * 1000
            log(f"single job {i + 1}/{args.jobs}: seen by a watch after {ms:.0f} ms")
            time.sleep(args.pause_s)  # what the last job's pods set off settles first
        time.sleep(2)  # the jobs' last status writes and Events
        end, cpu = time.time(), cpu_s(op.pid()) - cpu0
        reconciles = reconciles_of(op)
        plane = {k: v - plane0.get(k, 0.0) for k, v in plane_cpu_s(cp).items()}
        watch.stop()
        # SIGTERM and time for kopf's orderly exit, after which cProfile writes its file.
        assert op.process is not None and op.process.popen is not None
        os.killpg(op.process.popen.pid, signal.SIGTERM)
        op.process.popen.wait(120)
        user = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
        requests = requests_by(cp.audit_log, user, start, end)
        shutil.copy(cp.audit_log, args.out / "audit.log")
        (args.out / "sent.json").write_text(json.dumps(sent))
        timeline = job_timeline(cp.audit_log, user, sent)

    measured = {
        "jobs": args.jobs,
        "own_command": args.own_command,
        "requests_per_job": {k: round(v / args.jobs, 2) for k, v in requests.items()},
        "requests_total": sum(requests.values()),
        "operator_cpu_ms_per_job": round(cpu / args.jobs * 1000, 1),
        "reconciles_per_job": round(reconciles / args.jobs, 2),
        "plane_cpu_ms_per_job": per_job_ms(plane, args.jobs),
        "timeline_median_ms": timeline,
    }
    if args.no_profile:
        print(json.dumps(measured))
        return
    process = json.loads(Path(f"{prof}.json").read_text())
    stats = pstats.Stats(str(prof), stream=sys.stderr)
    stats.sort_stats("cumulative").print_stats(args.top)
    wanted = set(args.functions.split(","))
    per_job: dict[str, float] = {}
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, object]]
    raw = stats.stats  # type: ignore[attr-defined]
    for (file, line, func), (_, _, _, cum, _) in raw.items():
        if func in wanted and "ddp_operator" in file:
            key = f"{Path(file).name}:{line}:{func}"
            per_job[key] = round(cum / args.jobs * 1000, 2)
    print(
        json.dumps(
            {
                **measured,
                "process_cpu_s": round(process["process_cpu_s"], 2),
                "gc_collections": process["collections"],
                "gc_cpu_ms_per_job": round(process["cpu_s"] / args.jobs * 1000, 2),
                "cumulative_ms_per_job": dict(sorted(per_job.items(), key=lambda kv: -kv[1])),
                "profile": str(prof),
            }
        )
    )


def reconciles_of(op: OperatorProcess) -> float:
    """How many reconciles the operator has run, by its own metrics (the reconcile histogram's
    count); the scrape reads the number as it is when the jobs are done."""
    samples = scrape(op.metrics_url)
    return sum(v for (name, _), v in samples.items() if name == RECONCILES)


def plane_cpu_s(cp: ControlPlane) -> dict[str, float]:
    """CPU seconds each control-plane process (etcd, kube-apiserver, the controllers, kwok)
    has used so far: what a job's start costs the machine besides the operator."""
    out = {}
    for name, proc in cp.procs.items():
        if proc.popen is not None and proc.alive():
            with contextlib.suppress(OSError):
                out[name] = cpu_s(proc.popen.pid)
    return out


def per_job_ms(cpu: dict[str, float], jobs: int) -> dict[str, float]:
    """CPU ms per job of each process, the largest first, and their sum as ``total``."""
    ms = {k: round(v / jobs * 1000, 1) for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])}
    return {**ms, "total": round(sum(cpu.values()) / jobs * 1000, 1)}


def job_timeline(audit_log: Path, user: str, sent: dict[str, float]) -> dict[str, float]:
    """Medians over the jobs, in ms after the job's create was sent, of when the API server
    received and answered the operator's requests for it (from its audit log): each kind's
    first, and the first and last pod creates."""
    per: dict[str, dict[str, float]] = {job: {} for job in sent}
    for line in audit_log.read_text().splitlines():
        r = json.loads(line)
        ref = r.get("objectRef") or {}
        name = ref.get("name") or ""
        job = next((j for j in sent if name == j or name.startswith((j + "-", j + "."))), None)
        if r["user"]["username"] != user or job is None:
            continue
        what = f"{r['verb']} {ref.get('resource', '')}" + (
            f"/{ref['subresource']}" if ref.get("subresource") else ""
        )

        got = _stamp(r["requestReceivedTimestamp"]) - sent[job] * 1000
        done = _stamp(r["stageTimestamp"]) - sent[job] * 1000
        seen = per[job]
        if f"{what} received" not in seen:
            seen[f"{what} received"], seen[f"{what} answered"] = got, done
        if what == "create pods":
            seen["last create pods answered"] = max(done, seen.get("last create pods answered", 0))
    keys = sorted(
        {k for s in per.values() for k in s},
        key=lambda k: statistics.median(s[k] for s in per.values() if k in s),
    )
    return {k: round(statistics.median(s[k] for s in per.values() if k in s), 1) for k in keys}


def _stamp(rfc3339: str) -> float:
    """An audit record's timestamp, in ms of the epoch."""
    return dt.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() * 1000


if __name__ == "__main__":
    main()
