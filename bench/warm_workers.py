"""What warm workers save: the same single-node torchrun run with its workers forked warm by the
agent (``python -m ddp_trainer.launch.warm``) and started fresh (``python -m
torch.distributed.run``), alternating, on loopback.

Each run: ``--nproc`` workers of the bundled trainer, ``--steps`` steps of the synthetic
workload, no evaluation. Measured per run: the CPU time of the whole process tree (the
launcher's ``RUSAGE_CHILDREN``) and the wall time. Prints a line per run and, last, one JSON
object with the medians. ``python bench/warm_workers.py [--rounds 3] [--nproc 2]``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from repo_paths import source_path

LAUNCHERS = {"warm": "ddp_trainer.launch.warm", "fresh": "torch.distributed.run"}


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(mode: str, nproc: int, steps: int) -> dict[str, float]:
    settings = {
        "workload": "synthetic",
        "maxSteps": steps,
        "globalBatchSize": 64,
        "metricsPort": 0,
        "evaluate": False,
    }
    env = {
        **os.environ,
        "PYTHONPATH": source_path(),
        "DDP_TRAINER_CONFIG": json.dumps(settings),
        "OMP_NUM_THREADS": "1",
    }
    with tempfile.TemporaryDirectory(prefix="warm-bench-") as tmp:
        cmd = [sys.executable, "-m", LAUNCHERS[mode], "--standalone",
               f"--nproc-per-node={nproc}", "--monitor-interval=0.5", "-m", "ddp_trainer",
               "--checkpoint-dir", tmp]  # fmt: skip
        cpu0, wall0 = children_cpu_s(), time.monotonic()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall, cpu = time.monotonic() - wall0, children_cpu_s() - cpu0
    if done.returncode != 0:
        raise SystemExit(f"{mode} run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return {"cpu_s": round(cpu, 2), "wall_s": round(wall, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"warm": [], "fresh": []}
    for i in range(args.rounds):
        for mode in ("warm", "fresh"):
            got = run_once(mode, args.nproc, args.steps)
            runs[mode].append(got)
            print(f"round {i + 1}/{args.rounds} {mode}: {got}", flush=True)
    out: dict[str, float | int] = {"rounds": args.rounds, "nproc": args.nproc, "steps": args.steps}
    for mode, rows in runs.items():
        for key in ("cpu_s", "wall_s"):
            out[f"{key}_{mode}"] = round(statistics.median(r[key] for r in rows), 2)
    out["cpu_saved_per_worker_s"] = round(
        (float(out["cpu_s_fresh"]) - float(out["cpu_s_warm"])) / args.nproc, 2
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
