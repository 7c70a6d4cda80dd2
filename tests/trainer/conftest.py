"""Fixtures of the trainer tests: a launcher of real processes that cleans up after itself, and
what a test that runs the Trainer in the pytest process puts back."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from trainer_harness import Launcher


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    launch = Launcher(tmp_path)
    try:
        yield launch
    finally:
        launch.kill_all()


@pytest.fixture
def trainer_in_this_process() -> Iterator[None]:
    """Trainer.train installs a SIGTERM handler, and torch's threads are set to one: both are
    put back after a test that trains in the pytest process."""
    handler = signal.getsignal(signal.SIGTERM)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    signal.signal(signal.SIGTERM, handler)
    torch.set_num_threads(threads)
