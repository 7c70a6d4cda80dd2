"""TrainState, the Stateful part for the data position and the random generators."""

from __future__ import annotations

import random

import numpy as np
import torch

from ddp_trainer.batching import Position
from ddp_trainer.state import AT_TOP, TrainState, gather, scatter


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


def test_a_checkpoint_is_made_of_stateful_parts_with_train_state_at_the_top() -> None:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    train = TrainState(global_batch=32, num_samples=100)
    train.position = Position(step=2, epoch=0, samples_in_epoch=64)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    saved = gather({"model": model, "optimizer": optimizer, "scaler": scaler, AT_TOP: train})
    assert set(saved) == {"model", "optimizer", "scaler", "step", "epoch", "samplesInEpoch", "rng"}
    assert saved["step"] == 2 and not saved["scaler"]  # a GradScaler that is off saves nothing

    model2 = torch.nn.Linear(2, 1)
    optimizer2 = torch.optim.AdamW(model2.parameters())
    train2 = TrainState(global_batch=32, num_samples=100)
    parts = {"model": model2, "optimizer": optimizer2, "scaler": scaler, AT_TOP: train2}
    scatter(saved, parts)
    assert train2.position == train.position
    assert torch.equal(model2.weight, model.weight)
    assert optimizer2.state_dict()["state"][0]["step"] == 1
