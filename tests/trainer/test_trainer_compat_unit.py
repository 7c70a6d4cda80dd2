"""Which setting changes a resume refuses: those that change the run's meaning, named with both
values and the fix; every other setting may change, and an older checkpoint's missing keys are
their defaults."""

from __future__ import annotations

import pytest

from ddp_api.trainer_config import TrainerConfig
from ddp_trainer.state.compat import MEANING, IncompatibleResume, changed_meaning, check_resume


def settings(**fields: object) -> dict[str, object]:
    return TrainerConfig.model_validate(fields).to_json_dict()


def test_a_changed_seed_is_refused_naming_the_field_both_values_and_the_fix() -> None:
    with pytest.raises(IncompatibleResume) as refused:
        check_resume(settings(seed=7), settings(seed=8))
    message = str(refused.value)
    assert "seed" in message and "the checkpoint's 7, now 8" in message
    assert "Set seed back" in message and "new checkpoint folder" in message


@pytest.mark.parametrize(
    "change",
    [
        {"workload": "charlm"},
        {"epochs": 3},
        {"globalBatchSize": 32},
        {"lr": 0.1},
        {"minLr": 0.001},
        {"warmupSteps": 0},
        {"weightDecay": 0.1},
        {"scaleLr": True},
        {"baseBatchSize": 64},
    ],
)
def test_settings_that_change_the_run_are_refused(change: dict[str, object]) -> None:
    assert changed_meaning(settings(), settings(**change)) == list(change)


@pytest.mark.parametrize(
    "change",
    [
        {"maxSteps": 500},
        {"microBatchSize": 8},
        {"amp": "off"},
        {"device": "cpu"},
        {"checkpointEverySteps": 5},
        {"checkpointKeep": 9},
        {"logEverySteps": 1},
        {"metricsPort": 0},
        {"evaluate": False},
        {"evalMaxBatches": 2},
        {"holdAtSteps": [3]},
        {"pgTimeoutS": 60},
        {"stepTimeoutS": 30},
        {"bucketCapMb": 1.0},
        {"gradientAsBucketView": False},
        {"staticGraph": True},
        {"activationCheckpointing": True},
        {"gradClipNorm": 1.0},
    ],
)
def test_every_other_setting_may_change(change: dict[str, object]) -> None:
    check_resume(settings(), settings(**change))


def test_a_setting_not_in_the_meaning_set_may_change_so_new_settings_default_to_allowed() -> None:
    saved, now = settings(), settings()
    saved["aSettingOfALaterRelease"], now["aSettingOfALaterRelease"] = 1, 2
    check_resume(saved, now)
    assert set(MEANING) <= {f.alias for f in TrainerConfig.model_fields.values()}


def test_model_and_data_settings_count_for_the_workloads_that_read_them() -> None:
    assert changed_meaning(settings(workload="charlm"), settings(workload="charlm", nLayer=2)) == [
        "nLayer"
    ]
    assert changed_meaning(settings(), settings(nLayer=2, syntheticDim=4)) == []  # digits
    synthetic = settings(workload="synthetic")
    assert changed_meaning(synthetic, settings(workload="synthetic", syntheticDim=4)) == [
        "syntheticDim"
    ]
    plugin = "plugin_workload:build"  # a plugin may read any setting
    assert changed_meaning(
        settings(workload=plugin), settings(workload=plugin, nEmbd=64, nHead=4, dropout=0.1)
    ) == ["nEmbd", "dropout"]


def test_an_older_checkpoints_missing_settings_are_their_defaults() -> None:
    old = settings(seed=3)
    del old["dropout"], old["corpusMaxBytes"], old["activationCheckpointing"]
    check_resume(old, settings(seed=3))
    assert changed_meaning(old, settings(seed=3, workload="charlm", dropout=0.2)) == [
        "workload",
        "dropout",
    ]
    check_resume(None, settings(seed=4))  # a checkpoint without settings: nothing to compare
