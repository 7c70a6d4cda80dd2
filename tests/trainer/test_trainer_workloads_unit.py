"""Workloads: real data splits, charlm with activation checkpointing, a user plugin."""

from __future__ import annotations

import signal
from pathlib import Path

import torch

from ddp_api.trainer_config import TrainerConfig
from ddp_trainer.data.workloads import (
    CharGPT,
    build_workload,
    digits_data,
    read_corpus,
    token_cross_entropy,
)
from ddp_trainer.state.store import load_for_inference
from ddp_trainer.trainer import DistEnv, Trainer


def test_digits_split_is_stratified_and_fixed() -> None:
    train, test = digits_data()
    assert len(train) + len(test) == 1797 and len(test) == 359
    assert torch.equal(digits_data()[1].tensors[1], test.tensors[1])
    assert set(test.tensors[1].tolist()) == set(range(10))
    assert train.tensors[0].shape[1:] == (1, 8, 8) and train.tensors[0].max() <= 1.0


def test_charlm_reads_the_standard_library_by_default() -> None:
    text = read_corpus(None, 20_000)
    assert len(text) == 20_000 and b"import" in text
    config = TrainerConfig(workload="charlm", corpus_max_bytes=20_000, block_size=32)
    workload = build_workload(config)
    inputs, targets = workload.train_set.get_batch(torch.tensor([0, 3]))  # type: ignore[attr-defined]
    assert inputs.shape == targets.shape == (2, 32)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])


def test_activation_checkpointing_recomputes_but_gives_the_same_gradients() -> None:
    def gradients(recompute: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = CharGPT(32, 2, 2, 32, activation_checkpointing=recompute)
        idx = torch.randint(0, 256, (3, 32), generator=torch.Generator().manual_seed(1))
        token_cross_entropy(model(idx[:, :-1]), idx[:, 1:]).backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    plain, recomputed = gradients(False), gradients(True)
    assert len(plain) == len(recomputed)
    for a, b in zip(plain, recomputed, strict=True):
        torch.testing.assert_close(a, b)


def test_plugin_workload_trains_and_loads_for_inference(tmp_path: Path) -> None:
    handler = signal.getsignal(signal.SIGTERM)
    try:
        config = TrainerConfig(
            workload="plugin_workload:build", epochs=3, global_batch_size=50, amp="off"
        )
        trainer = Trainer(config, tmp_path, DistEnv())
        assert trainer.train() == 0
    finally:
        signal.signal(signal.SIGTERM, handler)
    model = load_for_inference(tmp_path)
    assert not model.training
    assert model(torch.zeros(5, 2)).shape == (5, 2)
