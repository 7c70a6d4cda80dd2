"""The pure parts of a step: loss weights by samples or tokens, the non-finite verdict."""

from __future__ import annotations

import math

import torch
from torch.utils.data import TensorDataset

from ddp_trainer.data.weighting import empty_loss, loss_terms, loss_weight
from ddp_trainer.data.workloads import (
    IGNORE_INDEX,
    count_not_ignored,
    evaluate,
    token_cross_entropy,
)
from ddp_trainer.step import too_many_non_finite


def test_sample_weights_are_todays_numbers() -> None:
    for count, world, batch in [(22, 3, 64), (21, 3, 64), (7, 1, 64), (16, 4, 64)]:
        assert loss_weight(count, world, batch) == count * (world / batch)


def test_token_weights_make_the_mean_over_every_token() -> None:
    # Two ranks, two micro-batches each, 3 + 9 and 1 + 7 tokens: 20 in all.
    means, tokens = [0.5, 2.0, 4.0, 1.0], [3, 9, 1, 7]
    total = torch.tensor(sum(tokens))
    pairs = list(zip(means, tokens, strict=True))
    per_rank = [sum(float(m * loss_weight(t, 2, total)) for m, t in pairs[i:][:2]) for i in (0, 2)]
    ddp_average = sum(per_rank) / 2
    assert math.isclose(ddp_average, sum(m * t for m, t in pairs) / 20, rel_tol=1e-6)


def test_targets_are_counted_without_padding() -> None:
    targets = torch.tensor([[1, 2, IGNORE_INDEX], [IGNORE_INDEX, IGNORE_INDEX, 3]])
    assert count_not_ignored(targets) == 3
    assert loss_terms(None, targets) == 2  # by samples
    assert loss_terms(count_not_ignored, targets) == 3
    logits = torch.randn(2, 3, 256)
    kept = targets != IGNORE_INDEX
    expected = torch.nn.functional.cross_entropy(logits[kept], targets[kept])
    assert torch.allclose(token_cross_entropy(logits, targets), expected)


def test_a_micro_batch_of_padding_adds_a_zero_gradient_not_nan() -> None:
    layer = torch.nn.Linear(4, 256)
    outputs = layer(torch.randn(2, 3, 4))
    loss = token_cross_entropy(outputs, torch.full((2, 3), IGNORE_INDEX))
    assert math.isnan(loss.detach().item())
    empty_loss(outputs, loss).backward()
    assert layer.weight.grad is not None and not layer.weight.grad.any()


def test_the_run_fails_only_after_the_limit_in_a_row() -> None:
    assert too_many_non_finite(2, 3, 7) is None
    assert too_many_non_finite(50, 0, 7) is None  # 0: never
    failure = too_many_non_finite(3, 3, 7)
    assert failure is not None
    assert str(failure) == (
        "3 consecutive steps with a non-finite loss or gradient at step 7: lower lr, enable "
        "gradClipNorm, or raise trainer.maxNonFiniteSteps"
    )


def test_the_test_loss_is_the_mean_over_tokens_however_the_set_is_batched() -> None:
    generator = torch.Generator().manual_seed(3)
    targets = torch.randint(0, 8, (6, 5), generator=generator)
    real = torch.tensor([5, 1, 0, 3, 2, 4])  # one sample is all padding
    targets[torch.arange(5) >= real.unsqueeze(1)] = IGNORE_INDEX
    model = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8))
    data = TensorDataset(targets.clamp(min=0), targets)
    loss_fn = token_cross_entropy
    cpu = torch.device("cpu")
    with torch.no_grad():
        whole = evaluate(model, data, loss_fn, 6, 10, cpu, count_not_ignored)
        one_by_one = evaluate(model, data, loss_fn, 1, 10, cpu, count_not_ignored)
        by_samples = evaluate(model, data, loss_fn, 1, 10, cpu)
    assert whole["testSamples"] == one_by_one["testSamples"] == 6
    assert math.isclose(whole["testLoss"], one_by_one["testLoss"], rel_tol=1e-5)
    assert math.isfinite(one_by_one["testLoss"])  # the batch of padding alone counts nothing
    assert not math.isclose(by_samples["testLoss"], whole["testLoss"], rel_tol=1e-3)
