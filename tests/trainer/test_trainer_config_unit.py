"""Settings: the torch-free model, its layering (defaults < YAML < env < CLI) and messages."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from trainer_harness import subprocess_env

from ddp_api.trainer_config import (
    ConfigError,
    TrainerConfig,
    build_arg_parser,
    build_config,
    load_settings,
    merge_layers,
)


def test_defaults_are_valid() -> None:
    config = TrainerConfig()
    assert config.workload == "digits" and config.amp == "auto"


def test_every_field_is_described_and_camel_cased() -> None:
    for name, field in TrainerConfig.model_fields.items():
        assert field.description, name
        assert field.alias and "_" not in field.alias
    schema = TrainerConfig.model_json_schema(by_alias=True)
    assert "$ref" not in json.dumps(schema) and "$defs" not in schema
    assert "globalBatchSize" in schema["properties"]


def test_unknown_amp_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"^amp: .*'fp8'"):
        build_config({"amp": "fp8"})


def test_unknown_setting_and_bad_values_are_named() -> None:
    with pytest.raises(ConfigError, match="globalBatchSise: unknown setting"):
        build_config({"globalBatchSise": 64})
    with pytest.raises(ConfigError, match=r"epochs: .*greater than or equal to 1"):
        build_config({"epochs": 0})
    with pytest.raises(ConfigError, match="workload: unknown workload 'mnist'"):
        build_config({"workload": "mnist"})
    with pytest.raises(ConfigError, match="minLr"):
        build_config({"lr": 0.001, "minLr": 0.01})


def test_plugin_workload_is_accepted() -> None:
    assert build_config({"workload": "my_pkg.models:build"}).is_plugin


def test_layers_override_in_order(tmp_path) -> None:
    yaml_file = tmp_path / "trainer.yaml"
    yaml_file.write_text("trainer:\n  epochs: 2\n  lr: 0.5\n  seed: 1\n  amp: bf16\n")
    environ = {
        "DDP_TRAINER_CONFIG": json.dumps({"lr": 0.25, "seed": 2, "checkpointKeep": 5}),
        "DDPJOB_CHECKPOINT_DIR": "/ckpt/from-env",
    }
    config, directory = load_settings(["--config", str(yaml_file), "--seed", "3"], environ)
    assert config.epochs == 2  # YAML over the default
    assert config.amp == "bf16"
    assert config.lr == 0.25 and config.checkpoint_keep == 5  # env over YAML
    assert config.seed == 3  # CLI over env
    assert str(directory) == "/ckpt/from-env"
    _, directory = load_settings(["--checkpoint-dir", "here"], environ)
    assert str(directory) == "here"


def test_cli_flags_parse_types() -> None:
    config, directory = load_settings(
        ["--global-batch-size", "32", "--no-gradient-as-bucket-view", "--max-steps", "7"], {}
    )
    assert config.global_batch_size == 32 and config.max_steps == 7
    assert config.gradient_as_bucket_view is False
    assert str(directory) == "checkpoints"


def test_merge_accepts_any_key_style() -> None:
    assert merge_layers({"global_batch_size": 1}, {"globalBatchSize": 2}) == {
        "global_batch_size": 2
    }


def test_help_lists_every_setting_with_its_description() -> None:
    text = build_arg_parser().format_help()
    for name, field in TrainerConfig.model_fields.items():
        assert "--" + name.replace("_", "-") in text
        assert field.alias in text


def test_config_module_does_not_import_torch() -> None:
    code = "import sys, ddp_api.trainer_config; assert 'torch' not in sys.modules; print('ok')"
    out = subprocess.run(
        [sys.executable, "-c", code], env=subprocess_env(), capture_output=True, text=True
    )
    assert out.stdout.strip() == "ok", out.stderr


def test_invalid_settings_exit_with_a_message() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ddp_trainer", "--amp", "fp8"],
        env=subprocess_env(),
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "--amp" in out.stderr
    env = subprocess_env(DDP_TRAINER_CONFIG='{"amp": "fp8"}')
    out = subprocess.run(
        [sys.executable, "-m", "ddp_trainer"], env=env, capture_output=True, text=True
    )
    assert out.returncode == 2 and "amp:" in out.stderr


def test_the_step_timeout_applies_once_training_runs_and_zero_turns_it_off() -> None:
    assert TrainerConfig().steady_timeout_s == 60
    assert build_config({"stepTimeoutS": 0, "pgTimeoutS": 300}).steady_timeout_s == 300
    assert build_config({"stepTimeoutS": 45}).steady_timeout_s == 45
    assert build_config({"pgTimeoutS": 30}).steady_timeout_s == 30  # never longer
    with pytest.raises(ConfigError, match=r"^stepTimeoutS: "):
        build_config({"stepTimeoutS": -1})
