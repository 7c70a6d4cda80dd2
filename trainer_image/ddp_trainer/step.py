"""One optimizer step, in the pieces both loops share (Restart mode's :mod:`ddp_trainer.trainer`,
PerStep mode's :mod:`ddp_trainer.per_step.trainer`): the step's learning rate, the forward pass's
autocast, Restart mode's forward and backward over a rank's micro-batches, and the gradient
update that skips a step whose gradient is not finite."""

from __future__ import annotations

import math
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from ddp_api.trainer_config import TrainerConfig
from ddp_trainer.data.loader import MicroBatches
from ddp_trainer.data.weighting import empty_loss, loss_weight
from ddp_trainer.parts import Parts
from ddp_trainer.reporting.tally import Tally
from ddp_trainer.schedule import lr_at


def set_lr(parts: Parts, config: TrainerConfig, step: int) -> float:
    """Sets the LR of ``step`` (0-based) in every parameter group; returns it."""
    lr = lr_at(
        step,
        peak=parts.peak_lr,
        warmup_steps=config.warmup_steps,
        total_steps=parts.total_steps,
        floor=config.min_lr,
    )
    for group in parts.optimizer.param_groups:
        group["lr"] = lr
    return lr


def autocast(parts: Parts) -> AbstractContextManager[Any]:
    """The forward pass's autocast (a no-op in fp32)."""
    dtype = parts.precision.dtype
    if dtype is None:
        return nullcontext()
    return torch.autocast(parts.device.type, dtype=getattr(torch, dtype))


def forward_backward(
    parts: Parts,
    micro_batches: MicroBatches,
    terms: list[int],
    total_terms: int | torch.Tensor,
    world_size: int,
    distributed: bool,
    tally: Tally,
) -> None:
    """Forward and backward over this rank's micro-batches of a step (``terms``: each one's loss
    terms; ``total_terms``: the global batch's), DDP's gradient all-reduce at the last one.

    Each micro-batch's mean loss is weighted so that DDP's average over ranks becomes the mean
    over every sample (or token) of the global batch, however it is split."""
    p = parts
    last = len(micro_batches) - 1
    for index, ((inputs, targets), count) in enumerate(zip(micro_batches, terms, strict=True)):
        inputs = inputs.to(p.device, non_blocking=True)
        targets = targets.to(p.device, non_blocking=True)
        sync = index == last or not distributed
        with nullcontext() if sync else p.net.no_sync():  # type: ignore[operator]
            with autocast(p):
                outputs = p.net(inputs)
                loss = p.loss_fn(outputs, targets)
            weight = loss_weight(count, world_size, total_terms)
            weighted = loss * weight if count else empty_loss(outputs, loss)
            # A disabled GradScaler (everything but fp16) passes through unchanged.
            p.scaler.scale(weighted).backward()
        if count:
            tally.add_loss(loss, count)


class NonFiniteSteps(Exception):
    """Too many steps in a row had a non-finite loss or gradient (trainer.maxNonFiniteSteps)."""


def too_many_non_finite(in_row: int, limit: int, step: int) -> NonFiniteSteps | None:
    """The failure after ``in_row`` consecutive non-finite steps, the last one ``step`` (None:
    training goes on); ``limit`` is trainer.maxNonFiniteSteps (0: never)."""
    if not limit or in_row < limit:
        return None
    return NonFiniteSteps(
        f"{in_row} consecutive steps with a non-finite loss or gradient at step {step}: lower "
        "lr, enable gradClipNorm, or raise trainer.maxNonFiniteSteps"
    )


class GradientUpdate:
    """The optimizer update of a step, skipped (and counted) when its gradient is not finite;
    too many such steps in a row raise :class:`NonFiniteSteps`."""

    def __init__(self, parts: Parts, config: TrainerConfig, tally: Tally):
        self.parts, self.config, self.tally = parts, config, tally
        self.non_finite_in_row = 0

    def apply(self, step: int) -> float:
        """The update of step ``step`` (1-based); returns the gradient norm."""
        p, c = self.parts, self.config
        scaling = p.scaler.is_enabled()
        if scaling:
            p.scaler.unscale_(p.optimizer)  # the true gradients' norm, not the scaled one's
        grads = [q.grad for q in p.model.parameters() if q.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads)  # clip_grad_norm_ in two halves:
        if c.grad_clip_norm:  # no multiplication by 1 when nothing is clipped
            torch.nn.utils.clip_grads_with_norm_(p.model.parameters(), c.grad_clip_norm, norm)
        grad_norm = float(norm)  # after DDP's all-reduce: the same on every rank
        finite = math.isfinite(grad_norm)
        if finite or scaling:  # fp16's GradScaler skips its own overflows (not counted here)
            p.scaler.step(p.optimizer)
            p.scaler.update()
            self.non_finite_in_row = 0
        else:
            self.non_finite_in_row += 1
            self.tally.non_finite(step, grad_norm, self.non_finite_in_row)
            failure = too_many_non_finite(self.non_finite_in_row, c.max_non_finite_steps, step)
            if failure is not None:
                raise failure
        p.optimizer.zero_grad(set_to_none=True)
        return grad_norm
