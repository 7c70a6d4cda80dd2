"""Where the development cluster keeps its cached binaries and its run state."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The version-keyed cache outside the checkout (``$DDP_CACHE``)."""
    return Path(os.environ.get("DDP_CACHE", Path.home() / ".cache" / "ddp-operator"))


def state_dir() -> Path:
    """Where ``python -m ddp_devcluster up`` records the running plane for ``down`` to find."""
    return Path(os.environ.get("DDP_CACHE_RUN", cache_dir() / "run"))


REPO = Path(__file__).resolve().parents[2]
# The folders whose packages make up the project (api, client, operator, trainer, dev harness):
# what a process started from the checkout needs on its PYTHONPATH.
SOURCE_DIRS = ("api", "client", "operator", "trainer_image", "devcluster")


def source_path(root: Path = REPO) -> str:
    """``SOURCE_DIRS`` of this checkout (or of ``root``, another revision's files) as a
    PYTHONPATH value."""
    return os.pathsep.join(str(root / d) for d in SOURCE_DIRS)
