"""Resume: exact after a kill, past a corrupt newest checkpoint, and after SIGTERM."""

from __future__ import annotations

import math
import signal

import pytest
from trainer_harness import Launcher, events, last_step, wait_until

from ddp_trainer.hold import release
from ddp_trainer.state.store import CheckpointStore

EXACT = {
    "workload": "digits",
    "epochs": 6,
    "globalBatchSize": 64,
    "amp": "off",
    "seed": 7,
    "checkpointEverySteps": 10,
    "checkpointKeep": 2,
    "logEverySteps": 1,
    "evaluate": False,
    "pgTimeoutS": 30,
}


def losses(directory) -> dict[int, list[float]]:
    by_step: dict[int, list[float]] = {}
    for line in events(directory, "step"):
        by_step.setdefault(line["step"], []).append(line["loss"])
    return by_step


@pytest.mark.timeout(240)
def test_killed_run_resumes_exactly_like_an_uninterrupted_one(launcher: Launcher) -> None:
    """Killed mid-epoch with batches read ahead by DataLoader workers (dropped at the kill), the
    resumed run's every step equals that of an uninterrupted run that reads in the process."""
    reference, interrupted = launcher.workdir / "reference", launcher.workdir / "interrupted"
    settings = {**EXACT, "epochs": 2, "dataWorkers": 0}  # 44 steps: into the second epoch
    run = launcher.standalone("reference", nproc=2, settings=settings, checkpoint_dir=reference)
    assert run.wait(120) == 0, run.tail()

    # Both runs hold after step 25; the first is killed there, the second finds it released.
    held = {**settings, "dataWorkers": 2, "prefetchSteps": 3, "holdAtSteps": [25]}
    first = launcher.standalone("first", nproc=2, settings=held, checkpoint_dir=interrupted)
    wait_until(lambda: events(interrupted, "hold"), 90, "the hold after step 25")
    first.kill_tree()
    assert last_step(interrupted) == 25
    release(interrupted, 25)
    second = launcher.standalone("second", nproc=2, settings=held, checkpoint_dir=interrupted)
    assert second.wait(120) == 0, second.tail()

    _, restart = events(interrupted, "start")
    # checkpointEverySteps 10: the resume is at step 20, mid-epoch (22 steps an epoch)
    assert restart["resumedFrom"] and restart["step"] == 20
    expected, got = losses(reference), losses(interrupted)
    assert sorted(got) == sorted(expected) == list(range(1, 2 * (1437 // 64) + 1))
    for step, values in got.items():
        for value in values:  # steps run twice (before the kill and after) match both times
            assert math.isclose(value, expected[step][0], rel_tol=1e-6), (step, value)
    # The first step after the resume continues the epoch at the saved sample cursor.
    resumed_steps = [s for s in events(interrupted, "step") if s["time"] > restart["time"]]
    assert resumed_steps[0]["step"] == restart["step"] + 1
    # Its rate counts the one step trained since the resume, not the 21 since step 0.
    assert [s["rateSteps"] for s in resumed_steps[:2]] == [1, 1]


@pytest.mark.timeout(180)
def test_corrupt_newest_checkpoint_is_skipped(launcher: Launcher) -> None:
    ckpt = launcher.workdir / "ckpt"
    settings = {**EXACT, "epochs": 2, "checkpointKeep": 3}
    run = launcher.alone("first", settings=settings, checkpoint_dir=ckpt)
    assert run.wait(120) == 0, run.tail()
    store = CheckpointStore(ckpt)
    assert [e.step for e in store.entries()] == [30, 40, 44]
    newest = ckpt / "step-00000044.pt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = b"\0" * 64  # bit rot in the middle
    newest.write_bytes(bytes(data))
    expected = losses(ckpt)

    again = launcher.alone("again", settings=settings, checkpoint_dir=ckpt)
    assert again.wait(120) == 0, again.tail()
    assert "skipping checkpoint step-00000044.pt" in again.output()
    restart = events(ckpt, "start")[-1]
    assert restart["resumedFrom"] == "step-00000040.pt" and restart["step"] == 40
    rerun = [s for s in events(ckpt, "step") if s["time"] >= restart["time"]]
    assert [s["step"] for s in rerun] == [41, 42, 43, 44]
    for line in rerun:
        assert math.isclose(line["loss"], expected[line["step"]][0], rel_tol=1e-6)
    entry, state = store.latest() or (None, None)
    assert entry is not None and entry.step == 44 and state is not None


@pytest.mark.timeout(180)
@pytest.mark.parametrize("workers", [0, 2])
def test_sigterm_leaves_a_checkpoint_of_the_last_step(launcher: Launcher, workers: int) -> None:
    """With data workers too: torchrun signals each worker's whole process group."""
    ckpt = launcher.workdir / "ckpt"
    settings = {**EXACT, "epochs": 20, "checkpointEverySteps": 0, "holdAtSteps": [20]}
    settings["dataWorkers"] = workers
    run = launcher.standalone("run", nproc=2, settings=settings, checkpoint_dir=ckpt)
    wait_until(lambda: events(ckpt, "hold"), 90, "the hold after step 20")
    run.signal(signal.SIGTERM)  # to torchrun only, as the kubelet does; it tells the workers
    assert run.wait(60) != 0
    assert "SIGTERM: stopping at step 20" in run.output(), run.tail()
    # The log says it is saved, as it says of each background write.
    assert "checkpoint step-00000020.pt written (synchronously, in " in run.output(), run.tail()
    assert "exited unexpectedly" not in run.output(), run.tail()
    assert last_step(ckpt) == 20
    found = CheckpointStore(ckpt).latest()
    assert found is not None, run.tail()
    entry, state = found
    assert entry.step == 20 and state["step"] == 20
    (saved,) = events(ckpt, "checkpoint")
    assert saved["synchronous"] and saved["step"] == 20
    assert not events(ckpt, "release")
