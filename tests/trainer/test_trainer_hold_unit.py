"""Hold points: which steps hold, release files, and the setting on the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_api.trainer_config import ConfigError, build_config, load_settings
from ddp_trainer.hold import holds_at, is_released, release, release_name


def test_holds_only_at_listed_steps_before_the_end() -> None:
    assert holds_at(25, (10, 25), total_steps=100)
    assert not holds_at(24, (10, 25), total_steps=100)
    assert not holds_at(100, (100,), total_steps=100)  # after the last step nothing is left
    assert not holds_at(5, (), total_steps=100)


def test_release_file_is_named_after_the_step(tmp_path: Path) -> None:
    assert release_name(25) == "release-step-00000025"
    assert not is_released(tmp_path, 25)
    path = release(tmp_path / "ckpt", 25)
    assert path == tmp_path / "ckpt" / "release-step-00000025" and path.exists()
    assert is_released(tmp_path / "ckpt", 25) and not is_released(tmp_path / "ckpt", 26)


def test_hold_setting_from_json_and_cli() -> None:
    assert build_config({"holdAtSteps": [25, 50]}).hold_at_steps == (25, 50)
    assert build_config({}).hold_at_steps == ()
    config, _ = load_settings(["--hold-at-steps", "5,10"], environ={})
    assert config.hold_at_steps == (5, 10)
    with pytest.raises(ConfigError, match=r"holdAtSteps\.0: .*greater than or equal to 1"):
        build_config({"holdAtSteps": [0]})
    with pytest.raises(SystemExit):
        load_settings(["--hold-at-steps", "soon"], environ={})
