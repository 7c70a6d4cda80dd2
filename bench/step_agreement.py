"""What the per-step agreement all-reduce (SIGTERM flag and loss-term count) costs: the step time
of a 2-process run against the trainer of another revision, and the collective alone.

    python bench/step_agreement.py [--base main] [--rounds 3] [--steps 300]

Prints one JSON object: ``step_ms`` (median per round of each, alternating rounds, `digits`,
gloo on CPU, 2 processes under torchrun) and ``agreement_us`` (median of 2000 agreements alone
in a 2-process gloo group).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from repo_paths import REPO, SOURCE_DIRS, child_env


def torchrun(root: Path, args: list[str], **extra: str) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node=2", "--monitor-interval=0.5", *args]
    subprocess.run(command, env=child_env(root, **extra), check=True, capture_output=True)


def step_ms(root: Path, steps: int, workdir: Path) -> float:
    """Median wall time of one step between log lines of a 2-process `digits` run."""
    settings = {
        "workload": "digits",
        "maxSteps": steps,
        "epochs": 100,
        "globalBatchSize": 64,
        "amp": "off",
        "checkpointEverySteps": 0,
        "logEverySteps": 10,
        "evaluate": False,
        "metricsPort": 0,
    }
    folder = Path(tempfile.mkdtemp(dir=workdir))
    torchrun(
        root,
        ["-m", "ddp_trainer", "--checkpoint-dir", str(folder)],
        DDP_TRAINER_CONFIG=json.dumps(settings),
    )
    lines = [json.loads(s) for s in (folder / "metrics.jsonl").read_text().splitlines()]
    steps_ = [m for m in lines if m["event"] == "step"][1:]  # the first holds the start
    per_step = [
        (b["time"] - a["time"]) / (b["step"] - a["step"]) for a, b in itertools.pairwise(steps_)
    ]
    return statistics.median(per_step) * 1000


def agreement_worker(iterations: int, out: Path) -> None:
    import torch
    import torch.distributed as dist

    from ddp_trainer.distributed import StepAgreement

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    device = torch.device("cpu")
    times = []
    for _ in range(iterations):
        started = time.perf_counter()
        StepAgreement(False, 1024, device, True).stop()
        times.append(time.perf_counter() - started)
    if dist.get_rank() == 0:
        out.write_text(json.dumps(statistics.median(times[100:]) * 1e6))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", default="main", help="the revision to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        agreement_worker(2000, args.worker)
        return
    with tempfile.TemporaryDirectory() as scratch:
        work, base = Path(scratch), Path(scratch) / "base"
        base.mkdir()
        archive = subprocess.run(
            ["git", "archive", args.base, *SOURCE_DIRS], cwd=REPO, capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        result: dict[str, list[float]] = {"base": [], "this": []}
        for _ in range(args.rounds):
            result["base"].append(round(step_ms(base, args.steps, work), 3))
            result["this"].append(round(step_ms(REPO, args.steps, work), 3))
        out = work / "agreement.json"
        torchrun(REPO, [str(Path(__file__).resolve()), "--worker", str(out)])
        print(
            json.dumps(
                {
                    "base": args.base,
                    "step_ms": result,
                    "step_ms_median": {k: statistics.median(v) for k, v in result.items()},
                    "agreement_us": round(json.loads(out.read_text()), 1),
                    "cpus": os.cpu_count(),
                    "load_avg_1m": os.getloadavg()[0],
                }
            )
        )


if __name__ == "__main__":
    main()
