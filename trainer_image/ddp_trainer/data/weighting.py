"""How much each micro-batch's mean loss counts, so that DDP's average over ranks is the mean over
every loss term of the global batch, however it is split over ranks and micro-batches.

A micro-batch of ``n`` terms (samples; or tokens, for a workload with ``count_targets``) out of
``N`` in the whole global batch gets the weight ``n * world_size / N``: DDP divides the sum over
ranks by ``world_size``, which leaves ``sum(n * mean) / N``, the mean over all ``N`` terms. By
samples, ``N`` is ``globalBatchSize``; by tokens it is counted on every rank and summed in the
step's one small all-reduce (:class:`ddp_trainer.distributed.StepAgreement`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def loss_terms(count_targets: Callable[[torch.Tensor], int] | None, targets: torch.Tensor) -> int:
    """Terms in the mean loss of a micro-batch: its samples, or what ``count_targets`` says."""
    return len(targets) if count_targets is None else int(count_targets(targets))


def loss_weight(
    terms: int, world_size: int, global_terms: int | torch.Tensor
) -> float | torch.Tensor:
    """The weight of a micro-batch's mean loss over ``terms`` terms (see the module docstring);
    ``global_terms`` may be the all-reduced count still on the device (nothing waits for it)."""
    if isinstance(global_terms, torch.Tensor):
        return (terms * world_size / global_terms.double()).float()
    return terms * (world_size / global_terms)


def empty_loss(outputs: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
    """The loss term of a micro-batch without any term (all padding): zero, with a gradient of
    zero for every parameter the forward pass used (DDP still waits for them), where the mean
    over no terms would be NaN."""
    if isinstance(outputs, torch.Tensor):
        return outputs.float().sum() * 0.0
    return loss.nan_to_num(0.0) * 0.0
