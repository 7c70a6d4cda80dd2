"""Real runs of what a resume keeps: the run's meaning (a changed seed is refused, a longer
maxSteps goes on), each rank's own random generators, the micro-batch cap of the first start
when the world shrinks, and a staticGraph that accumulation turns off instead of crashing."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from trainer_harness import Launcher, checkpoint_files, events

from ddp_trainer.state.train_state import rng_fingerprint

BASE = {
    "workload": "digits",
    "globalBatchSize": 64,
    "amp": "off",
    "seed": 3,
    "checkpointEverySteps": 0,
    "logEverySteps": 1,
    "evaluate": False,
    "pgTimeoutS": 30,
}


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One 2-rank run of 4 steps, made once: the checkpoint folder that the resume tests
    each copy and go on from (a torchrun start costs more than the steps)."""
    launcher = Launcher(tmp_path_factory.mktemp("four-steps"))
    ckpt = launcher.workdir / "ckpt"
    try:
        first = launcher.standalone(
            "first", nproc=2, settings={**BASE, "maxSteps": 4}, checkpoint_dir=ckpt
        )
        assert first.wait(300) == 0, first.tail()
        yield ckpt
    finally:
        launcher.kill_all()


def copy_of(folder: Path, launcher: Launcher) -> Path:
    return Path(shutil.copytree(folder, launcher.workdir / "ckpt"))


@pytest.mark.timeout(900)
def test_a_resume_keeps_the_runs_meaning_and_each_ranks_own_generators(
    launcher: Launcher, four_steps: Path
) -> None:
    ckpt = copy_of(four_steps, launcher)
    saved = torch.load(ckpt / "step-00000004.pt", weights_only=True)
    prints = [rng_fingerprint(state) for state in saved["rngByRank"]]
    assert len(prints) == 2 and prints[0] != prints[1]  # each rank's own, saved by rank 0
    before = checkpoint_files(ckpt)

    changed = {**BASE, "seed": 4, "maxSteps": 6}
    why = launcher.workdir / "termination-log"  # the pod's /dev/termination-log
    refused = launcher.standalone(
        "seed",
        nproc=2,
        settings=changed,
        checkpoint_dir=ckpt,
        extra_env={"DDPJOB_TERMINATION_LOG": str(why)},
    )
    assert refused.wait(300) != 0
    assert "seed: the checkpoint's 3, now 4" in refused.output(), refused.tail()
    assert "new checkpoint folder" in refused.output()
    # What the operator reads to fail the job at once, saying why (ddp_api.contract).
    said = why.read_text()
    assert said.startswith("IncompatibleResume: cannot resume: the settings differ from the")
    assert "(seed: the checkpoint's 3, now 4)" in said and "\n" not in said
    assert checkpoint_files(ckpt) == before  # nothing written, nothing deleted

    longer = launcher.standalone(
        "longer", nproc=2, settings={**BASE, "maxSteps": 6}, checkpoint_dir=ckpt
    )
    assert longer.wait(300) == 0, longer.tail()
    out = longer.output()
    for rank in range(2):
        line = f"random generators of rank {rank} after the resume: saved by rank {rank}"
        assert f"{line} ({prints[rank]})" in out, longer.tail()
    assert events(ckpt, "start")[-1]["step"] == 4 and events(ckpt, "step")[-1]["step"] == 6


@pytest.mark.timeout(600)
def test_a_shrunk_run_without_micro_batch_size_accumulates_instead_of_growing_its_batch(
    launcher: Launcher, four_steps: Path
) -> None:
    ckpt = copy_of(four_steps, launcher)
    assert torch.load(ckpt / "step-00000004.pt", weights_only=True)["microBatchCap"] == 32
    alone = launcher.alone("one", settings={**BASE, "maxSteps": 5}, checkpoint_dir=ckpt)
    assert alone.wait(300) == 0, alone.tail()
    two, one = events(ckpt, "start")
    assert (two["perRankBatch"], two["accumulation"]) == (32, 1)
    assert (one["worldSize"], one["perRankBatch"], one["accumulation"]) == (1, 64, 2)


@pytest.mark.timeout(300)
def test_static_graph_with_accumulation_is_turned_off_and_the_run_completes(
    launcher: Launcher,
) -> None:
    ckpt = launcher.workdir / "ckpt"
    settings = {**BASE, "staticGraph": True, "microBatchSize": 8, "maxSteps": 3}
    run = launcher.standalone("static", nproc=2, settings=settings, checkpoint_dir=ckpt)
    assert run.wait(300) == 0, run.tail()
    assert "trainer.staticGraph is turned off" in run.output()
    (start,) = events(ckpt, "start")
    assert start["accumulation"] == 4 and events(ckpt, "step")[-1]["step"] == 3
