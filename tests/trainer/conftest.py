"""Fixtures of the trainer tests: a launcher of real processes that cleans up after itself."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from trainer_harness import Launcher


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    launch = Launcher(tmp_path)
    try:
        yield launch
    finally:
        launch.kill_all()
