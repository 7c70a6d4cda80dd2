"""The bundled trainer's CUDA paths, which the CPU machine CI runs on cannot take: Restart mode
over NCCL with fp16 autocast and a GradScaler, resumed from its checkpoint; PerStep mode's
cross-group process group on NCCL (torchft's ``ProcessGroupNCCL``), its fp16 GradScaler stepped
only on a passed commit vote, and a group SIGKILLed mid-run that heals from its live peer while
the peer trains on.

Not a ``test_`` module, so ``make test`` (pytest over tests/trainer) does not collect it: it
runs only where it is named, on a machine with a GPU, and each test fails (never skips) where
CUDA is missing: ``make gpu-check``, or on a GPU machine without internet ``make gpu-wheels``
where PyPI is reached and ``tests/trainer/cuda_offline.sh`` there (docs/benchmarks.md says
where it last ran). One
GPU serves every process: two replica groups on it get distinct ``NCCL_HOSTID`` values, so NCCL
treats them as two hosts (it refuses two ranks of one communicator on one device of one host)
and connects them over sockets, as across machines."""

from __future__ import annotations

import itertools
import math
import time
from pathlib import Path

import pytest
import torch
from replica_groups import (
    committed_step,
    group_env,
    lighthouse,
    pod,
    sample_lines,
    scaler_by_step,
)
from trainer_harness import Launcher, Proc, events, wait_until

from ddp_devcluster.recipes import digits
from ddp_trainer import hold
from ddp_trainer.state.store import CheckpointStore, read_completion


@pytest.fixture(autouse=True)
def _a_gpu() -> None:
    """A run without CUDA fails each test: these check the GPU paths, nothing else."""
    if not torch.cuda.is_available():
        pytest.fail("needs a CUDA device: run this module on a machine with a GPU")


FP16 = {"device": "cuda", "amp": "fp16", "evaluate": False, "logEverySteps": 10}
INITIAL_SCALE = 65536.0  # torch.amp.GradScaler's default init_scale
NCCL_INFO = {"NCCL_DEBUG": "INFO"}
WATCHDOG_S = 60  # torch's NCCL watchdog ended a survivor this long after its peer's loss


def _scaler_state(folder: Path) -> tuple[int, dict[str, float]]:
    entry, state = CheckpointStore(folder).latest() or (None, {})
    assert entry is not None, f"no checkpoint in {folder}"
    return entry.step, state["scaler"]


def test_restart_mode_trains_fp16_with_a_grad_scaler_over_nccl_and_resumes(
    launcher: Launcher, tmp_path: Path
) -> None:
    """torchrun with one worker on the GPU: the NCCL process group, fp16 autocast and the
    GradScaler (whose scale backs off from 65536 on the first overflowing steps and is saved);
    a second run resumes from the checkpoint at step 40 and trains on to 60."""
    ckpt = tmp_path / "ckpt"
    first = digits(**FP16, maxSteps=40, checkpointEverySteps=20)
    run = launcher.standalone(
        "fp16", nproc=1, settings=first, checkpoint_dir=ckpt, extra_env=NCCL_INFO
    )
    assert run.wait(300) == 0, run.tail()
    (start,) = events(ckpt, "start")
    assert start["amp"] == "float16+GradScaler" and start["device"] == "cuda:0", start
    assert "NCCL INFO" in run.output(), run.tail()  # the process group is NCCL's
    losses = [s["loss"] for s in events(ckpt, "step")]
    assert losses and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0], losses
    step, scaler = _scaler_state(ckpt)
    assert step == 40 and 0 < scaler["scale"] <= INITIAL_SCALE, scaler

    again = launcher.standalone(
        "fp16-resumed", nproc=1, settings={**first, "maxSteps": 60}, checkpoint_dir=ckpt
    )
    assert again.wait(300) == 0, again.tail()
    steps = [s["step"] for s in events(ckpt, "step")]
    assert steps[-1] == 60 and steps.count(41) <= 1, steps
    resumed = events(ckpt, "start")[-1]
    assert resumed["step"] == 40 and resumed["resumedFrom"], resumed


def test_bf16_is_what_auto_picks_on_a_gpu_that_supports_it(
    launcher: Launcher, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    settings = digits(**{**FP16, "amp": "auto"}, maxSteps=10, checkpointEverySteps=0)
    run = launcher.standalone("auto", nproc=1, settings=settings, checkpoint_dir=ckpt)
    assert run.wait(300) == 0, run.tail()
    (start,) = events(ckpt, "start")
    assert start["device"] == "cuda:0", start
    expected = "bfloat16" if torch.cuda.is_bf16_supported(including_emulation=False) else "float16"
    assert start["amp"] == expected, start


def test_per_step_groups_on_nccl_commit_fp16_steps_and_one_heals_while_the_other_trains(
    launcher: Launcher, tmp_path: Path
) -> None:
    """Two replica groups on the GPU (torchft's ProcessGroupNCCL across them): group 1 is
    SIGKILLed at step 40 and started again at once; group 0 never stops or crashes, group 1
    heals from it (not from the checkpoint volume), both end 0, every step 1..total was
    committed, every group's fp16 GradScaler had the same scale and growth count at each step
    (one update per committed step: ``replica_groups.scaler_by_step``), and the last step's is
    the one saved.

    Hold points keep the GPU's speed from outrunning the scene: the run waits at step UP until
    both groups are up, and the survivor waits at CEILING until the new group 1 has started
    (it trains alone from the kill to there)."""
    up, ceiling, total = 10, 120, 200
    ckpt, samples = tmp_path / "ckpt", tmp_path / "samples"
    _, url = lighthouse(launcher, heartbeat_ms=2000, join_ms=500)
    settings = digits(
        **FP16, maxSteps=total, globalBatchSize=48, checkpointEverySteps=50,
        holdAtSteps=[up, ceiling],
    )  # fmt: skip

    def start(group: int, name: str) -> Proc:
        env = group_env(group, url, groups=2, timeout_s=10.0, samples=samples)
        env.update(NCCL_INFO, NCCL_HOSTID=f"ddp-gpu-check-group-{group}")
        return pod(launcher, name, env=env, settings=settings, checkpoint_dir=ckpt)

    def started(proc: Proc) -> bool:
        return "replica group" in proc.output()

    survivor, victim = start(0, "group-0"), start(1, "group-1")
    wait_until(lambda: started(survivor) and started(victim), 300, "both groups up")
    hold.release(ckpt, up)
    wait_until(lambda: committed_step(samples) >= 40, 300, "step 40 committed")
    victim.kill_tree()
    killed, killed_at, killed_wall = time.monotonic(), committed_step(samples), time.time()
    again = start(1, "group-1-again")
    # The survivor waits at the ceiling past the moment torch's NCCL watchdog would end it
    # (a minute after the peer's loss, by default): it must still be alive and train on.
    wait_until(
        lambda: started(again) and time.monotonic() - killed > WATCHDOG_S + 15,
        300,
        "the new group 1 up, and the watchdog's minute past",
    )
    alone = committed_step(samples)  # the steps group 0 made alone while group 1 restarted
    released = time.time()
    hold.release(ckpt, ceiling)
    assert survivor.wait(600) == 0, survivor.tail()
    assert again.wait(120) == 0, again.tail()

    assert "NCCL INFO" in survivor.output(), survivor.tail()  # the cross-group PG is NCCL's
    # a lost peer is no reason for a flight-recorder dump (per_step.group.no_nccl_dumps)
    assert "dump signal" not in survivor.output(), survivor.tail()
    assert "healed from a live peer" in again.output(), again.tail()
    assert "resumed from checkpoint" not in again.output()
    by_file: dict[str, list[int]] = {}
    for r in sample_lines(samples):
        if r["event"] == "committed":
            by_file.setdefault(r["file"], []).append(r["step"] + 1)
    assert set().union(*by_file.values()) == set(range(1, total + 1))
    # one sample log per process, named job-<group>-<local rank>-<pid>: group 0 never restarted
    # and committed every step from its first on (step UP + 1 at the latest: group 1 may reach
    # the first hold before group 0's first quorum, which then heals); group 1's first process
    # trained with it before the kill; the new group 1 healed past the kill
    (mine,) = [sorted(v) for f, v in by_file.items() if f.startswith("job-0-")]
    assert mine == list(range(mine[0], total + 1)) and mine[0] <= up + 1, mine[:3]
    first, new = sorted((v for f, v in by_file.items() if f.startswith("job-1-")), key=min)
    assert max(first) > up, max(first)
    assert min(new) > killed_at, (killed_at, min(new))
    assert read_completion(ckpt) is not None
    step, scaler = _scaler_state(ckpt)
    assert step == total and 0 < scaler["scale"] <= INITIAL_SCALE, scaler
    agreed = scaler_by_step(samples, total)  # every group's scaler alike, one update a step
    assert (scaler["scale"], scaler["_growth_tracker"]) == agreed[-1], (scaler, agreed[-1])
    # the survivor's longest pause between commits from the kill to the hold at CEILING
    times = [killed_wall] + [
        r["time"] for r in sample_lines(samples)
        if r["event"] == "committed" and r["file"].startswith("job-0-")
        and killed_wall < r["time"] < released
    ]  # fmt: skip
    pause = max((b - a for a, b in itertools.pairwise(times)), default=released - killed_wall)
    print(
        f"PerStep on CUDA: group 1 killed at step {killed_at}; group 0's longest pause since:"
        f" {pause:.2f}s; group 0 trained on alone to step"
        f" {alone} and lived {time.monotonic() - killed:.0f}s past the kill; the new group 1"
        f" healed and committed from step {min(new)}; scaler {scaler}"
    )
