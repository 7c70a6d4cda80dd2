"""Nothing trained is lost: a real Trainer in this process, on a checkpoint folder whose newest
file cannot be read once, or whose background write of one step fails."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from faulty_disk import FailingWrite, FlakyReads
from prometheus_client import generate_latest
from trainer_harness import events

from ddp_api.trainer_config import TrainerConfig
from ddp_trainer.state.store import CheckpointStore, Entry, checkpoint_name
from ddp_trainer.trainer import DistEnv, Trainer

SETTINGS = {
    "workload": "digits",
    "maxSteps": 18,
    "checkpointEverySteps": 3,
    "checkpointKeep": 3,
    "logEverySteps": 1,
    "evaluate": False,
    "amp": "off",
}

pytestmark = pytest.mark.usefixtures("trainer_in_this_process")


def trainer(directory: Path, **settings: Any) -> Trainer:
    return Trainer(TrainerConfig.model_validate({**SETTINGS, **settings}), directory, DistEnv())


def use(run: Trainer, store: CheckpointStore) -> None:
    """``run`` reads and writes its checkpoints through ``store``."""
    run.checkpoints.store = store
    assert run.checkpoints.writer is not None
    run.checkpoints.writer.store = store


class StopAfter(CheckpointStore):
    """Stops a run (as SIGTERM does) once the checkpoint of ``step`` is written."""

    def __init__(self, directory: Path, step: int, stop: threading.Event):
        super().__init__(directory, keep=SETTINGS["checkpointKeep"])
        self.step, self.stop = step, stop

    def write(self, step: int, state: dict[str, Any]) -> Entry:
        entry = super().write(step, state)
        if step == self.step:
            self.stop.set()
        return entry


class Reports:
    """Rank 0's progress reports, and whether the checkpoint each one names was on disk then."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.named: list[tuple[str, bool]] = []

    def offer(self, record: dict[str, Any], final: bool, urgent: bool = False) -> None:
        name = record["lastCheckpoint"]
        listed = {e.name for e in CheckpointStore(self.directory).entries()}
        self.named.append((name, name in listed and (self.directory / name).is_file()))

    def close(self) -> None:
        pass


def saves(directory: Path) -> list[tuple[int, bool]]:
    return [(line["step"], line["synchronous"]) for line in events(directory, "checkpoint")]


def failures(run: Trainer) -> float:
    text = generate_latest(run.checkpoints.metrics.registry).decode()
    (line,) = [
        x for x in text.splitlines() if x.startswith("ddp_trainer_checkpoint_failures_total")
    ]
    return float(line.split()[-1])


def test_an_unreadable_newest_checkpoint_is_read_again_and_nothing_newer_is_deleted(
    tmp_path: Path,
) -> None:
    # A run stopped by SIGTERM while held after step 12 leaves checkpoints 6, 9 and 12.
    first = trainer(tmp_path, holdAtSteps=[12])
    use(first, StopAfter(tmp_path, 12, first.stop_requested))
    assert first.train() == 143
    assert [e.step for e in CheckpointStore(tmp_path).entries()] == [6, 9, 12]

    # The next attempt's first read of step 12 fails (EIO); it is stopped after one step.
    flaky = FlakyReads(tmp_path, checkpoint_name(12), failures=1)
    second = trainer(tmp_path, holdAtSteps=[12])
    use(second, flaky)
    second.stop_requested.set()
    assert second.train() == 143
    assert (tmp_path / checkpoint_name(12)).is_file()  # a fallback to 9 deleted it at step 10
    assert second.checkpoints.resumed_from == checkpoint_name(12) and flaky.tries == 2
    # Step 13's checkpoint took step 6's place; 12 is still there.
    assert [e.step for e in CheckpointStore(tmp_path).entries()] == [9, 12, 13]
    found = CheckpointStore(tmp_path).latest()
    assert found is not None and found[0].step == 13 and found[1]["step"] == 13


def test_a_failed_background_write_is_written_at_sigterm_and_counted(tmp_path: Path) -> None:
    run = trainer(tmp_path, holdAtSteps=[6])
    # The background write of step 6 fails; SIGTERM comes while the run is held after step 6.
    use(run, FailingWrite(tmp_path, 6, then=run.stop_requested.set))
    run.tally.reporter = reports = Reports(tmp_path)  # type: ignore[assignment]
    assert run.train() == 143
    assert saves(tmp_path) == [(3, False), (6, False), (6, True)]
    assert [e.step for e in CheckpointStore(tmp_path).entries()] == [3, 6]
    assert failures(run) == 1
    assert all(on_disk for name, on_disk in reports.named if name), reports.named
    assert reports.named[-1][0] == checkpoint_name(6)


def test_after_a_failed_background_write_the_next_checkpoint_is_synchronous(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = trainer(tmp_path, maxSteps=9)
    use(run, FailingWrite(tmp_path, 3))
    run.tally.reporter = reports = Reports(tmp_path)  # type: ignore[assignment]
    assert run.train() == 0  # the failure did not stop training
    assert saves(tmp_path) == [(3, False), (6, True), (9, True)]
    assert [e.step for e in CheckpointStore(tmp_path).entries()] == [6, 9]
    assert failures(run) == 1
    assert "writing the checkpoint of step 3 failed" in caplog.text
    names = [name for name, _ in reports.named]
    assert checkpoint_name(3) not in names and names[-1] == checkpoint_name(9)
    assert all(on_disk for name, on_disk in reports.named if name), reports.named


def test_a_start_that_trains_no_step_reports_only_where_it_is_the_runs_one_report(
    tmp_path: Path,
) -> None:
    """A start that resumes at the last step trains nothing. Where it is the job's one report
    (a new job given a finished run's claim) it reports the position; where another group of
    the same run completed it (PerStep's ``_done_elsewhere`` sets ``untold_final`` False) it
    reports nothing: a final report with no loss, no rate and its world alone would replace
    the last one of the groups that trained (seen on kind: a replacement group left the
    Succeeded job's status with no loss and 1 group)."""
    run = trainer(tmp_path, maxSteps=4)
    run.tally.reporter = trained = Reports(tmp_path)  # type: ignore[assignment]
    assert run.train() == 0
    assert trained.named and trained.named[-1][0] == checkpoint_name(4)
    for untold_final, expected in ((True, [(checkpoint_name(4), True)]), (False, [])):
        late = trainer(tmp_path, maxSteps=4)
        late.tally.reporter = reports = Reports(tmp_path)  # type: ignore[assignment]
        late.tally.untold_final = untold_final
        assert late.train() == 0
        assert late.checkpoints.resumed_from == checkpoint_name(4)
        assert reports.named == expected
