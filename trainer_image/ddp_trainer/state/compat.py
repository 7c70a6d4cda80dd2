"""Whether a resume may continue a checkpoint's run under the settings it starts with (pure):
the settings that give a run its meaning must be the checkpoint's; every other one may change."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddp_api.trainer_config import BUILTIN_WORKLOADS, TrainerConfig

# The settings that make a run what it is (camelCase, as checkpoints store them), each with the
# workloads it matters to (None: all; a plugin reads any setting, so it counts for plugins too).
# Changing one at a resume would reshuffle the data, jump the LR, or not fit the saved weights.
# Every setting not listed here may change (maxSteps, microBatchSize, amp, checkpointing, ...).
MEANING: Mapping[str, tuple[str, ...] | None] = {
    "workload": None,
    "seed": None,  # data order and initial weights
    "epochs": None,  # the LR schedule's length and the data
    "globalBatchSize": None,
    "lr": None,
    "minLr": None,
    "warmupSteps": None,
    "weightDecay": None,
    "scaleLr": None,
    "baseBatchSize": None,
    "corpus": ("charlm",),
    "corpusMaxBytes": ("charlm",),
    "blockSize": ("charlm",),
    "nLayer": ("charlm",),
    "nHead": ("charlm",),
    "nEmbd": ("charlm",),
    "dropout": ("charlm",),
    "syntheticSamples": ("synthetic",),
    "syntheticDim": ("synthetic",),
    "syntheticHidden": ("synthetic",),
}


class IncompatibleResume(ValueError):
    """The settings differ from the checkpoint's in one that changes the run's meaning."""


def _defaults() -> dict[str, Any]:
    return {
        field.alias or name: TrainerConfig.model_fields[name].default
        for name, field in TrainerConfig.model_fields.items()
    }


def changed_meaning(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """The MEANING settings whose value differs between the checkpoint's ``saved`` settings and
    ``now`` (both camelCase JSON dicts); a key an older checkpoint lacks had its default."""
    defaults = _defaults()
    workload = now.get("workload", defaults["workload"])
    changed = []
    for key, workloads in MEANING.items():
        if workloads is not None and workload in BUILTIN_WORKLOADS and workload not in workloads:
            continue  # a built-in workload that never reads this setting
        before = saved.get(key, defaults.get(key))
        after = now.get(key, defaults.get(key))
        if before != after:
            changed.append(key)
    return changed


def check_resume(saved: Mapping[str, Any] | None, now: Mapping[str, Any]) -> None:
    """Raises IncompatibleResume naming each changed setting, both values and the fix; a
    checkpoint without settings (none saved) passes."""
    if not saved:
        return
    changed = changed_meaning(saved, now)
    if not changed:
        return
    defaults = _defaults()
    values = "; ".join(
        f"{key}: the checkpoint's {saved.get(key, defaults.get(key))!r}, now "
        f"{now.get(key, defaults.get(key))!r}"
        for key in changed
    )
    names = ", ".join(changed)
    raise IncompatibleResume(
        f"cannot resume: the settings differ from the checkpoint's in {names}, which would "
        f"change the run's meaning ({values}). Set {names} back to the checkpoint's value, or "
        "use a new checkpoint folder to start a new run. Settings that may change at a resume "
        "are listed in trainer_image/README.md."
    )
