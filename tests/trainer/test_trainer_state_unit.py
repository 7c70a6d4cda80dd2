"""TrainState, the Stateful part for the data position and the random generators."""

from __future__ import annotations

import random

import numpy as np
import torch

from ddp_trainer.data.batching import Position
from ddp_trainer.state.train_state import (
    AT_TOP,
    TrainState,
    cuda_state_for,
    gather,
    rng_fingerprint,
    rng_for_rank,
    rng_state,
    scatter,
    seed_rngs,
    set_rng_state,
)


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
    keys = {"step", "epoch", "samplesInEpoch", "microBatchCap", "rng", "rngByRank"}
    assert keys == set(state)  # the checkpoint's keys


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
    assert set(saved) == {"model", "optimizer", "scaler", "step", "epoch", "samplesInEpoch"} | {
        "microBatchCap",
        "rng",
        "rngByRank",
    }
    assert saved["step"] == 2 and not saved["scaler"]  # a GradScaler that is off saves nothing

    model2 = torch.nn.Linear(2, 1)
    optimizer2 = torch.optim.AdamW(model2.parameters())
    train2 = TrainState(global_batch=32, num_samples=100)
    parts = {"model": model2, "optimizer": optimizer2, "scaler": scaler, AT_TOP: train2}
    scatter(saved, parts)
    assert train2.position == train.position
    assert torch.equal(model2.weight, model.weight)
    assert optimizer2.state_dict()["state"][0]["step"] == 1


def generators() -> tuple[float, float, torch.Tensor]:
    return random.random(), float(np.random.rand()), torch.rand(2)


def test_each_rank_gets_its_own_saved_generators_and_a_rank_without_one_a_fresh_one() -> None:
    states = []
    for rank in range(2):
        seed_rngs(9, rank, step=4)
        states.append(rng_state())
    assert rng_fingerprint(states[0]) != rng_fingerprint(states[1])
    saved = {"step": 4, "epoch": 0, "samplesInEpoch": 0, "rng": states[0], "rngByRank": states}
    for rank in range(3):  # the world grew to 3
        random.seed(100)
        train = TrainState(global_batch=6, num_samples=60, rank=rank, seed=9, world_size=3)
        train.load_state_dict(saved)
        restored = rng_fingerprint(rng_state())
        if rank < 2:
            assert restored == rng_fingerprint(states[rank])
            assert train.restored_rng == f"saved by rank {rank}"
        else:  # fresh, from (seed, rank, step): not another rank's, and not left as it was
            seed_rngs(9, 2, step=4)
            assert restored == rng_fingerprint(rng_state())
            assert train.restored_rng.startswith("fresh")


def test_a_checkpoint_of_the_older_format_gives_rank_0_its_state_and_others_fresh_ones() -> None:
    seed_rngs(1, 0)
    old = {"rng": rng_state(), "step": 2}
    assert rng_for_rank(old, 0) is old["rng"]
    assert rng_for_rank(old, 1) is None
    assert rng_for_rank({"rngByRank": [old["rng"], None]}, 1) is None  # a rank that sent none


def test_python_and_numpy_are_seeded_per_rank() -> None:
    seed_rngs(5, 0)
    zero = generators()
    seed_rngs(5, 1)
    one = generators()
    seed_rngs(5, 0)
    again = generators()
    assert zero[:2] != one[:2] and zero[:2] == again[:2] and torch.equal(zero[2], again[2])


def test_cuda_states_of_more_devices_than_visible_are_not_indexed() -> None:
    four = [torch.full((16,), i, dtype=torch.uint8) for i in range(4)]  # an older checkpoint's
    assert torch.equal(cuda_state_for(four, 1), four[1])  # type: ignore[arg-type]
    assert cuda_state_for(four, 5) is None  # no such device in the saved list
    assert cuda_state_for(four[2], 0) is four[2]  # the new format: its rank's device only
    state = rng_state()
    state["cuda"] = four
    set_rng_state(state)  # without a GPU here: nothing indexes a device that is not there
