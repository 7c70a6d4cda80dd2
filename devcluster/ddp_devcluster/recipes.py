"""The small digits run that the trainer tests and benchmarks start from: the settings they
share (a CPU run, no AMP, no evaluation) and the steps of an epoch, so that each names only
what it changes."""

from __future__ import annotations

from typing import Any

DIGITS_SAMPLES = 1437  # scikit-learn's digits, the training split
DIGITS_BATCH = 64
DIGITS_STEPS_PER_EPOCH = DIGITS_SAMPLES // DIGITS_BATCH


def digits(**changes: Any) -> dict[str, Any]:
    """``spec.trainer`` of a digits run in camelCase, with ``changes`` over the shared base."""
    base: dict[str, Any] = {
        "workload": "digits",
        "globalBatchSize": DIGITS_BATCH,
        "amp": "off",
        "evaluate": False,
    }
    return {**base, **changes}


def synthetic(**changes: Any) -> dict[str, Any]:
    """A tiny synthetic run (an MLP on random data, 8 features and 16 hidden units: seconds on a
    CPU) with ``changes`` over the shared base."""
    base: dict[str, Any] = {
        "workload": "synthetic",
        "syntheticDim": 8,
        "syntheticHidden": 16,
        "globalBatchSize": 32,
        "amp": "off",
        "evaluate": False,
        "logEverySteps": 1,
    }
    return {**base, **changes}
