"""`trainer.compile` on CPU: samples/s of eager and compiled training, and the compile time.

    python bench/compile_speedup.py [--workload charlm] [--steps 30] [--warmup 5]

Prints one JSON object. Each mode is one ddp_trainer run in this process (one process, no
DDP, `--threads` torch threads): the steady speed is the samples/s between the end of step
`--warmup` and the last step (from the run log's step lines); the compile time is how much
longer the steps up to `--warmup` took than the same number of steady steps (the first
forward and backward compile; later steps may recompile for another batch shape).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import repo_paths

repo_paths.add()


def measure(settings: dict[str, Any], directory: Path, warmup: int) -> dict[str, float]:
    """One run: its steady samples/s and the extra seconds of its first `warmup` steps."""
    from ddp_api.trainer_config import TrainerConfig
    from ddp_trainer.reporting.run_log import read_run_log
    from ddp_trainer.trainer import DistEnv, Trainer

    config = TrainerConfig.model_validate(settings)
    Trainer(config, directory, DistEnv()).train()
    lines = read_run_log(directory)
    (start,) = (m for m in lines if m["event"] == "start")
    steps = {m["step"]: m["time"] for m in lines if m["event"] == "step"}
    last = max(steps)
    steady_s = (steps[last] - steps[warmup]) / (last - warmup)
    return {
        "samples_per_s": config.global_batch_size / steady_s,
        "steady_step_ms": 1000 * steady_s,
        "warmup_extra_s": steps[warmup] - start["time"] - warmup * steady_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", default="charlm", choices=["charlm", "synthetic", "digits"])
    parser.add_argument("--steps", type=int, default=30, help="steps of each run")
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the speed")
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--amp", default="off", help="the runs' trainer.amp")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the runs")
    args = parser.parse_args()

    import logging

    import torch

    logging.getLogger("ddp_trainer").setLevel(logging.WARNING)
    torch.set_num_threads(args.threads)
    settings = {
        "workload": args.workload,
        "amp": args.amp,
        "globalBatchSize": args.global_batch,
        "maxSteps": args.steps,
        "checkpointEverySteps": 0,
        "logEverySteps": 1,
        "evaluate": False,
        "metricsPort": 0,
    }
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="compile-bench-") as tmp:
        for mode, compile_on in (("eager", False), ("compiled", True)):
            started = time.perf_counter()
            run = measure({**settings, "compile": compile_on}, Path(tmp) / mode, args.warmup)
            results[mode] = {**run, "run_s": time.perf_counter() - started}
    eager, compiled = results["eager"], results["compiled"]
    print(
        json.dumps(
            {
                "compile_speedup": round(compiled["samples_per_s"] / eager["samples_per_s"], 3),
                "eager_samples_per_s": round(eager["samples_per_s"], 1),
                "compiled_samples_per_s": round(compiled["samples_per_s"], 1),
                "compile_s": round(compiled["warmup_extra_s"] - eager["warmup_extra_s"], 1),
                "eager_run_s": round(eager["run_s"], 1),
                "compiled_run_s": round(compiled["run_s"], 1),
                "setup": f"{args.workload}, global batch {args.global_batch}, amp {args.amp}, "
                f"{args.steps} steps ({args.warmup} warmup), 1 process, "
                f"{args.threads} torch thread(s), torch {torch.__version__}",
                "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, no GPU",
                "load_average_1m": round(os.getloadavg()[0], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
