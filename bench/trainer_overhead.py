"""Trainer overhead: throughput against a bare DDP loop, checkpoint stall, recovery time.

    python bench/trainer_overhead.py [--plot out/trainer_overhead.png] [--throughput-only]

Prints one JSON object and writes a plot. Three measurements, all real processes:

- throughput_ratio_vs_bare: ddp_trainer's samples/s over a minimal hand-written DDP loop,
  same model (the `synthetic` MLP), data, world size and AMP setting, alternating rounds
  inside one torchrun run (median of each). The bare loop indexes its tensors in the loop
  (no DataLoader); ddp_trainer reads through its DataLoader with its default dataWorkers
  (0 on CPU: in the training process) unless `--data-workers` says otherwise.
- checkpoint_stall_ms: how much longer the training step that follows a checkpoint takes
  than a median step (the snapshot copy plus the background write's interference), for
  `charlm` at its default size, one process.
- recovery_s: from SIGKILL of one node (agent and worker) of a 2-node loopback job with a
  dedicated rendezvous store to the first completed step after the resume.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import repo_paths
from ddp_devcluster.procs import free_port, kill_tree
from repo_paths import REPO

repo_paths.add()

from ddp_api import rdzv_store  # noqa: E402


def child_env(**extra: str) -> dict[str, str]:
    return repo_paths.child_env(
        PYTHONUNBUFFERED="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", **extra
    )


# throughput (runs inside torchrun) ------------------------------------------------------


def bare_loop_rate(config: Any, steps: int, warmup: int) -> float:
    """Samples/s of a minimal DDP loop: DistributedSampler, autocast, AdamW."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DistributedSampler

    from ddp_trainer.amp import resolve_amp
    from ddp_trainer.data.workloads import synthetic_data, synthetic_model

    world, rank = dist.get_world_size(), dist.get_rank()
    train, _ = synthetic_data(config)
    inputs, labels = train.tensors
    model = DistributedDataParallel(synthetic_model(config))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    precision = resolve_amp(config.amp, "cpu", True)
    dtype = getattr(torch, precision.dtype) if precision.dtype else None
    sampler: DistributedSampler[int] = DistributedSampler(
        train, num_replicas=world, rank=rank, seed=0, drop_last=True
    )
    per_rank = config.global_batch_size // world
    done, epoch, started = 0, 0, 0.0
    while done < warmup + steps:
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler))
        for batch in order.split(per_rank):
            if len(batch) < per_rank or done == warmup + steps:
                break
            if done == warmup:
                started = time.perf_counter()
            with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = F.cross_entropy(model(inputs[batch]), labels[batch])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done += 1
        epoch += 1
    return steps * config.global_batch_size / (time.perf_counter() - started)


def trainer_rate(config: Any, directory: Path) -> float:
    """Samples/s of ddp_trainer between its first and last logged step."""
    from ddp_trainer.reporting.run_log import read_run_log
    from ddp_trainer.trainer import Trainer

    Trainer(config, directory).train()
    steps = [m for m in read_run_log(directory) if m["event"] == "step"]
    first, last = steps[0], steps[-1]
    return (
        (last["step"] - first["step"]) * config.global_batch_size / (last["time"] - first["time"])
    )


def throughput_worker(args: argparse.Namespace) -> None:
    import logging

    import torch
    import torch.distributed as dist

    from ddp_api.trainer_config import TrainerConfig

    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    warmup = 5
    config = TrainerConfig.model_validate(
        dict(
            workload="synthetic",
            amp=args.amp,
            global_batch_size=args.global_batch,
            max_steps=warmup + args.steps,
            warmup_steps=warmup,
            checkpoint_every_steps=0,
            log_every_steps=args.steps,
            evaluate=False,
            data_workers=args.data_workers,
        )
    )
    bare, ours = [], []
    for round_index in range(args.rounds):
        dist.barrier()
        bare.append(bare_loop_rate(config, args.steps, warmup))
        dist.barrier()
        directory = Path(args.workdir) / f"round-{round_index}"
        ours.append(trainer_rate(config, directory))
    if dist.get_rank() == 0:
        result = {"bare": bare, "ours": ours, "world": dist.get_world_size()}
        Path(args.workdir, "throughput.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def measure_throughput(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    directory = workdir / "throughput"
    directory.mkdir()
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={args.nproc}",
        str(Path(__file__).resolve()),
        "--worker",
        "--workdir",
        str(directory),
        f"--amp={args.amp}",
        f"--steps={args.steps}",
        f"--rounds={args.rounds}",
        f"--global-batch={args.global_batch}",
        *([f"--data-workers={args.data_workers}"] if args.data_workers is not None else []),
    ]
    subprocess.run(command, env=child_env(), check=True, stdout=subprocess.DEVNULL)
    return json.loads((directory / "throughput.json").read_text())


# checkpoint stall -----------------------------------------------------------------------


def measure_checkpoint_stall(workdir: Path, steps: int, every: int) -> dict[str, Any]:
    import logging

    import torch

    from ddp_api.trainer_config import TrainerConfig
    from ddp_trainer.reporting.run_log import read_run_log
    from ddp_trainer.trainer import Trainer

    logging.getLogger("ddp_trainer").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    directory = workdir / "stall"
    config = TrainerConfig.model_validate(
        dict(
            workload="charlm",
            amp="off",
            max_steps=steps,
            checkpoint_every_steps=every,
            log_every_steps=1,
            evaluate=False,
        )
    )
    trainer = Trainer(config, directory)
    parameters = sum(p.numel() for p in trainer.parts.model.parameters())
    trainer.train()
    lines = read_run_log(directory)
    step_lines = [m for m in lines if m["event"] == "step"]
    step_ms = {
        m["step"]: 1000 * config.global_batch_size / m["samplesPerSecond"] for m in step_lines
    }
    async_ckpts = [m for m in lines if m["event"] == "checkpoint" and not m["synchronous"]]
    after = [c["step"] + 1 for c in async_ckpts if c["step"] + 1 in step_ms]
    normal = [ms for s, ms in step_ms.items() if s not in after and s != 1]
    median = statistics.median(normal)
    stalls = [step_ms[s] - median for s in after]
    size = (directory / f"step-{steps:08d}.pt").stat().st_size
    return {
        "stall_ms": statistics.mean(stalls),
        "blocked_ms": statistics.mean(c["blockedMs"] for c in async_ckpts),
        "median_step_ms": median,
        "checkpoint_mb": size / 2**20,
        "parameters": parameters,
        "step_ms": step_ms,
        "checkpoint_steps": [c["step"] for c in async_ckpts],
    }


# recovery -------------------------------------------------------------------------------


def wait_for(predicate: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.02)
    raise TimeoutError("recovery benchmark: timed out")


def measure_recovery(workdir: Path) -> dict[str, Any]:
    from ddp_trainer.reporting.run_log import read_run_log

    directory = workdir / "recovery"
    ckpt = directory / "ckpt"
    directory.mkdir()
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(directory / f"{name}.log", "wb") as log:
            popen = subprocess.Popen(
                [sys.executable, *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=directory,
            )
        procs.append(popen)
        return popen

    settings = {
        "workload": "digits",
        "epochs": 200,
        "amp": "off",
        "checkpointEverySteps": 20,
        "logEverySteps": 1,
        "pgTimeoutS": 30,
    }
    conf = (
        "join_timeout=120,last_call_timeout=2,close_timeout=10,read_timeout=20,"
        "keep_alive_interval=1,keep_alive_max_attempt=3,is_host=false"
    )
    try:
        start(
            "store",
            ["-c", rdzv_store.program(), "--host", "127.0.0.1", f"--port={port}"],
            child_env(),
        )
        nodes = [
            start(
                f"node-{i}",
                [
                    "-m",
                    "torch.distributed.run",
                    "--nnodes=1:2",
                    "--nproc-per-node=1",
                    "--rdzv-backend=c10d",
                    f"--rdzv-endpoint=127.0.0.1:{port}",
                    "--rdzv-id=bench",
                    f"--rdzv-conf={conf}",
                    "--max-restarts=3",
                    "--monitor-interval=0.5",
                    "--local-addr=127.0.0.1",
                    "-m",
                    "ddp_trainer",
                    "--checkpoint-dir",
                    str(ckpt),
                ],
                child_env(DDP_TRAINER_CONFIG=json.dumps(settings)),
            )
            for i in range(2)
        ]

        def steps() -> list[dict[str, Any]]:
            return [m for m in read_run_log(ckpt) if m["event"] == "step"]

        wait_for(lambda: [s for s in steps() if s["worldSize"] == 2 and s["step"] >= 50], 180)
        killed_at = time.time()
        kill_tree(nodes[0].pid)
        first = wait_for(
            lambda: [s for s in steps() if s["time"] > killed_at and s["worldSize"] == 1], 180
        )[0]
        timeline = [(s["time"] - killed_at, s["step"], s["worldSize"]) for s in steps()]
        return {
            "recovery_s": first["time"] - killed_at,
            "resumed_step": first["step"],
            "timeline": timeline,
        }
    finally:
        for popen in procs:
            kill_tree(popen.pid)
            popen.wait()


# report ---------------------------------------------------------------------------------


def plot(
    path: Path, throughput: dict[str, Any], stall: dict[str, Any], recovery: dict[str, Any]
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    rounds = range(1, len(throughput["bare"]) + 1)
    axes[0].plot(rounds, throughput["bare"], "o-", label="bare DDP loop")
    axes[0].plot(rounds, throughput["ours"], "s-", label="ddp_trainer")
    axes[0].set(title="synthetic MLP, samples/s", xlabel="round", ylabel="samples/s")
    axes[0].set_ylim(bottom=0)
    axes[0].legend()
    steps = sorted(stall["step_ms"])
    axes[1].plot(steps, [stall["step_ms"][s] for s in steps], ".-")
    for step in stall["checkpoint_steps"]:
        axes[1].axvline(step + 0.5, color="red", alpha=0.3)
    axes[1].set(title="charlm step time (red: checkpoint)", xlabel="step", ylabel="ms")
    t, s, w = zip(*recovery["timeline"], strict=True)
    axes[2].scatter(t, s, c=w, s=6)
    axes[2].axvline(0, color="red", label="node killed")
    axes[2].set(title="recovery after node loss", xlabel="s since kill", ylabel="step")
    axes[2].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--plot", default=str(REPO / "out" / "trainer_overhead.png"))
    parser.add_argument("--amp", default="auto", help="AMP setting of the throughput comparison")
    parser.add_argument("--nproc", type=int, default=2, help="world size of the throughput run")
    parser.add_argument("--steps", type=int, default=100, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--global-batch", type=int, default=256)
    parser.add_argument(
        "--data-workers", type=int, help="ddp_trainer's dataWorkers (default: its own default)"
    )
    parser.add_argument("--stall-steps", type=int, default=16)
    parser.add_argument("--stall-every", type=int, default=4)
    parser.add_argument(
        "--throughput-only", action="store_true", help="only the throughput comparison, no plot"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        throughput_worker(args)
        return
    with tempfile.TemporaryDirectory(prefix="trainer-bench-") as tmp:
        workdir = Path(tmp)
        throughput = measure_throughput(args, workdir)
        if not args.throughput_only:
            stall = measure_checkpoint_stall(workdir, args.stall_steps, args.stall_every)
            recovery = measure_recovery(workdir)
    bare, ours = statistics.median(throughput["bare"]), statistics.median(throughput["ours"])
    result = {
        "throughput_ratio_vs_bare": round(ours / bare, 4),
        "trainer_samples_per_s": round(ours, 1),
        "bare_samples_per_s": round(bare, 1),
        "rounds_bare": [round(r, 1) for r in throughput["bare"]],
        "rounds_trainer": [round(r, 1) for r in throughput["ours"]],
        "throughput_setup": f"synthetic MLP, world {throughput['world']} (gloo, CPU), "
        f"global batch {args.global_batch}, amp {args.amp}, {args.steps} steps a round, "
        f"median of {args.rounds} rounds",
        "throughput_data": "bare loop: tensors indexed in the loop, no DataLoader; ddp_trainer: "
        "its DataLoader, dataWorkers "
        + ("default (0 on CPU)" if args.data_workers is None else str(args.data_workers)),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, no GPU",
    }
    if args.throughput_only:
        print(json.dumps(result))
        return
    plot(Path(args.plot), throughput, stall, recovery)
    result |= {
        "checkpoint_stall_ms": round(stall["stall_ms"], 2),
        "checkpoint_blocked_ms": round(stall["blocked_ms"], 2),
        "charlm_median_step_ms": round(stall["median_step_ms"], 1),
        "charlm_parameters": stall["parameters"],
        "charlm_checkpoint_mb": round(stall["checkpoint_mb"], 2),
        "recovery_s": round(recovery["recovery_s"], 2),
        "plot": args.plot,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
