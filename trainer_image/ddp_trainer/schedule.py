"""The learning rate as one pure function of the optimizer step: linear warmup, then cosine."""

from __future__ import annotations

import math


def peak_lr(lr: float, global_batch_size: int, base_batch_size: int, scale: bool) -> float:
    """The peak LR, scaled linearly with the global batch when `scale` is set."""
    return lr * global_batch_size / base_batch_size if scale else lr


def lr_at(step: int, *, peak: float, warmup_steps: int, total_steps: int, floor: float) -> float:
    """LR of the optimizer step with 0-based index `step`.

    Warmup rises linearly to `peak` over `warmup_steps` steps (the first step already
    gets peak / warmup_steps, never 0); then a half cosine falls to `floor` at the last step.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    decay_steps = total_steps - warmup_steps - 1
    if decay_steps <= 0:
        return peak
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (peak - floor)
