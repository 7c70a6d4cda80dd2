"""This process's share of a PerStep step: its sample indices (its part of the step's global batch,
in Restart mode's order: :mod:`ddp_trainer.data.sampler`) and the forward and backward over
them, the gradient of the share's mean loss (each micro-batch's mean loss weighted by its part
of the share's loss terms)."""

from __future__ import annotations

import logging

import torch

from ddp_trainer.data.batching import Position, position_after
from ddp_trainer.data.sampler import global_order
from ddp_trainer.data.weighting import empty_loss, loss_terms
from ddp_trainer.data.workloads import fetch_batch
from ddp_trainer.parts import Parts
from ddp_trainer.per_step.replicas import micro_split, share_weights
from ddp_trainer.state.train_state import TrainState
from ddp_trainer.step import autocast

log = logging.getLogger("ddp_trainer.trainer")


def position_of(step: int, state: TrainState) -> Position:
    """The data position of ``step``: a pure function of it (the global batch never changes in
    a run), the same on every group whatever it healed or loaded."""
    return position_after(Position(0, 0, 0), step, state.global_batch, state.num_samples)


def aligned(position: Position, step: int, state: TrainState) -> Position:
    """``step``'s data position (:func:`position_of`); a warning when ``position`` was not it."""
    here = position_of(step, state)
    if here != position:
        log.warning("data position %s set to step %d's %s", position, step, here)
    return here


class Shares:
    """The sample indices of a share of a step (the epoch's permutation is kept, as it is
    needed again at every step of the epoch)."""

    def __init__(self, num_samples: int, seed: int):
        self.num_samples, self.seed = num_samples, seed
        self._order: tuple[int, torch.Tensor] | None = None

    def indices(self, pos: Position, share: tuple[int, int]) -> torch.Tensor:
        """The indices of ``share`` (start, count) of the global batch of the step at ``pos``."""
        if self._order is None or self._order[0] != pos.epoch:
            self._order = (pos.epoch, global_order(self.num_samples, self.seed, pos.epoch))
        start, count = share
        first = pos.samples_in_epoch + start
        return self._order[1][first : first + count]


def forward_backward(
    parts: Parts, indices: torch.Tensor
) -> tuple[torch.Tensor, int, tuple[int, ...]]:
    """Forward and backward over ``indices`` in micro-batches (no all-reduce here), each
    micro-batch's mean loss weighted by its share of the loss terms
    (:func:`~ddp_trainer.per_step.replicas.share_weights`: ``.grad`` is then the share's mean
    loss's); returns the summed loss over their loss terms, the loss terms, and the micro-batch
    sizes."""
    p = parts
    loss_sum = torch.zeros((), device=p.device)
    micro = micro_split(len(indices), p.state.micro_batch_cap)
    batches = [fetch_batch(p.train_set, part) for part in indices.split(list(micro))]
    terms = [loss_terms(p.count_targets, targets) for _, targets in batches]
    for (inputs, targets), count, weight in zip(batches, terms, share_weights(terms), strict=True):
        inputs = inputs.to(p.device, non_blocking=True)
        targets = targets.to(p.device, non_blocking=True)
        with autocast(p):
            outputs = p.net(inputs)
            loss = p.loss_fn(outputs, targets)
        weighted = loss * weight if count else empty_loss(outputs, loss)
        p.scaler.scale(weighted).backward()
        if count:
            loss_sum += loss.detach().float() * count
    return loss_sum, sum(terms), micro
