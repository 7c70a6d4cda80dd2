"""`trainer.compile`: a compiled run's checkpoints hold the plain model's keys, so a run resumes
compiled from an eager one's checkpoint and eager from a compiled one's."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_harness import events

from ddp_api.trainer_config import TrainerConfig
from ddp_devcluster.recipes import synthetic
from ddp_trainer.data.workloads import build_model
from ddp_trainer.state.store import CheckpointStore
from ddp_trainer.trainer import DistEnv, Trainer

# A tiny MLP: compiling it on CPU (inductor, gcc) takes seconds, not minutes.
TINY = synthetic(syntheticSamples=256, checkpointEverySteps=3)

pytestmark = pytest.mark.usefixtures("trainer_in_this_process")


def train(directory: Path, **settings: object) -> Trainer:
    config = TrainerConfig.model_validate({**TINY, **settings})
    trainer = Trainer(config, directory, DistEnv())
    assert trainer.train() == 0
    return trainer


@pytest.mark.timeout(600)
def test_checkpoints_load_across_compiled_and_eager_runs(tmp_path: Path) -> None:
    compiled = train(tmp_path, compile=True, maxSteps=3)
    assert type(compiled.parts.net).__name__ == "OptimizedModule"
    entry, state = CheckpointStore(tmp_path).latest() or (None, {})
    assert entry is not None and entry.step == 3
    plain = build_model(TrainerConfig.model_validate(TINY)).state_dict()
    assert sorted(state["model"]) == sorted(plain)  # no `_orig_mod.`, no `module.`

    eager = train(tmp_path, compile=False, maxSteps=6)
    assert eager.parts.net is eager.parts.model
    again = train(tmp_path, compile=True, maxSteps=9)
    assert type(again.parts.net).__name__ == "OptimizedModule"

    starts = events(tmp_path, "start")
    assert [(s["step"], s["resumedFrom"]) for s in starts] == [
        (0, None),
        (3, "step-00000003.pt"),
        (6, "step-00000006.pt"),
    ]
    assert [s["step"] for s in events(tmp_path, "step")] == list(range(1, 10))
