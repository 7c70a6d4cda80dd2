"""Pure arithmetic: shares of the global batch, micro-batches, positions, LR, AMP choice."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from ddp_trainer.amp import Precision, resolve_amp
from ddp_trainer.data.batching import (
    Position,
    advance,
    batch_share,
    micro_batch_cap,
    micro_sizes,
    position_after,
    rank_share,
    settle,
    steps_per_epoch,
    total_steps,
)
from ddp_trainer.parts import bf16_native, use_static_graph
from ddp_trainer.schedule import lr_at, peak_lr
from ddp_trainer.state.train_state import TrainState


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 7, 64])
def test_shares_tile_the_global_batch(world: int) -> None:
    shares = [rank_share(64, world, r) for r in range(world)]
    assert shares[0][0] == 0
    assert all(a[0] + a[1] == b[0] for a, b in itertools.pairwise(shares))
    assert sum(count for _, count in shares) == 64
    assert max(c for _, c in shares) - min(c for _, c in shares) <= 1


def test_global_batch_smaller_than_world_is_refused() -> None:
    with pytest.raises(ValueError, match="globalBatchSize"):
        rank_share(2, 3, 0)


def test_micro_batches_keep_the_last_one_full() -> None:
    assert micro_sizes(10, 3) == (3, 3, 4)
    assert micro_sizes(2, 3) == (0, 1, 1)
    share = batch_share(64, 3, 2, micro_batch_size=8)
    assert share.count == 21 and share.accumulation_steps == 3 and sum(share.micro_sizes) == 21
    assert batch_share(64, 2, 0).micro_sizes == (32,)


def test_positions_advance_through_epochs() -> None:
    assert steps_per_epoch(1437, 64) == 22
    assert total_steps(10, 22, None) == 220 and total_steps(10, 22, 50) == 50
    position = Position(0, 0, 0)
    for _ in range(22):
        position = advance(position, 64, 1437)
    assert position == Position(22, 1, 0)
    # A resume with a larger global batch that no longer fits moves to the next epoch.
    assert settle(Position(21, 0, 1344), 128, 1437) == Position(21, 1, 0)


@pytest.mark.parametrize("start", [Position(0, 0, 0), Position(30, 1, 512), Position(7, 3, 1344)])
def test_position_after_is_advance_repeated(start: Position) -> None:
    position = start
    for steps in range(80):
        assert position_after(start, steps, 64, 1437) == position, steps
        position = advance(position, 64, 1437)


def test_lr_warms_up_then_follows_a_cosine_to_the_floor() -> None:
    lrs = [lr_at(s, peak=1.0, warmup_steps=4, total_steps=25, floor=0.1) for s in range(25)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert lrs[4] == 1.0 and math.isclose(lrs[-1], 0.1)
    assert all(a >= b for a, b in itertools.pairwise(lrs[4:]))
    assert math.isclose(lrs[14], 0.55)  # halfway through the decay
    assert peak_lr(0.1, 512, 256, scale=True) == 0.2 and peak_lr(0.1, 512, 256, False) == 0.1


def test_amp_resolution() -> None:
    assert resolve_amp("auto", "cpu", False).dtype == "bfloat16"
    assert resolve_amp("auto", "cuda", True).label == "bfloat16"
    assert resolve_amp("auto", "cuda", False).label == "float16+GradScaler"
    assert resolve_amp("fp16", "cpu", True).grad_scaler
    assert resolve_amp("off", "cuda", True).dtype is None


def test_amp_auto_picks_bf16_only_where_the_device_has_it_natively() -> None:
    assert resolve_amp("auto", "cuda", bf16_supported=True).label == "bfloat16"  # A100, H100
    assert resolve_amp("auto", "cuda", bf16_supported=False).label == "float16+GradScaler"


def test_bf16_native_does_not_count_emulation(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[bool] = []

    def v100(including_emulation: bool = True) -> bool:  # emulates bf16, lacks it natively
        asked.append(including_emulation)
        return including_emulation

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", v100)
    assert not bf16_native(torch.device("cuda", 0)) and asked == [False]
    precision = resolve_amp("auto", "cuda", bf16_native(torch.device("cuda", 0)))
    assert precision == Precision("float16", grad_scaler=True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert bf16_native(torch.device("cuda", 0))
    assert bf16_native(torch.device("cpu"))


def test_without_micro_batch_size_the_first_starts_share_caps_the_micro_batch() -> None:
    first = TrainState(64, 640, world_size=4).micro_batch_cap
    assert first == 16  # a run's first start: its own share
    resumed = TrainState(64, 640, world_size=2)  # shrunk to 2, resumed: the cap stays
    resumed.load_state_dict(TrainState(64, 640, world_size=4).state_dict())
    assert micro_batch_cap(None, resumed.micro_batch_cap) == 16
    shrunk = batch_share(64, 2, 0, micro_batch_cap(None, first))
    assert (shrunk.count, shrunk.micro_sizes) == (32, (16, 16))
    grown = batch_share(64, 8, 0, micro_batch_cap(None, first))
    assert (grown.count, grown.accumulation_steps) == (8, 1)  # growing keeps shares smaller
    assert micro_batch_cap(4, first) == 4  # microBatchSize, when set, decides


def test_static_graph_only_without_accumulation() -> None:
    one, two = batch_share(64, 2, 0, 32), batch_share(64, 2, 1, 16)
    assert use_static_graph(True, one) and not use_static_graph(False, one)
    assert not use_static_graph(True, two)  # pytorch/pytorch#143580
