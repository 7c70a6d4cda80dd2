"""TrainState, the Stateful part for the data position and the random generators."""

from __future__ import annotations

import random

import numpy as np
import torch

from ddp_trainer.batching import Position
from ddp_trainer.state import TrainState


def test_train_state_round_trips_the_position_and_every_generator() -> None:
    saved = TrainState(global_batch=32, num_samples=100)
    saved.position = Position(step=5, epoch=1, samples_in_epoch=32)
    torch.manual_seed(1), random.seed(1), np.random.seed(1)
    state = saved.state_dict()
    expected = (torch.rand(3), random.random(), np.random.rand())

    restored = TrainState(global_batch=32, num_samples=100)
    restored.load_state_dict(state)
    assert restored.position == Position(step=5, epoch=1, samples_in_epoch=32)
    again = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(again[0], expected[0]) and again[1:] == expected[1:]
    assert {"step", "epoch", "samplesInEpoch", "rng"} == set(state)  # the checkpoint's keys


def test_a_cursor_without_room_for_one_more_batch_moves_to_the_next_epoch() -> None:
    saved = TrainState(global_batch=32, num_samples=100)
    saved.position = Position(step=3, epoch=0, samples_in_epoch=96)
    restored = TrainState(global_batch=32, num_samples=100)
    restored.load_state_dict(saved.state_dict())
    assert restored.position == Position(step=3, epoch=1, samples_in_epoch=0)
