"""Where the development cluster keeps its cached binaries and its run state."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The version-keyed cache outside the checkout (``$DDP_CACHE``)."""
    return Path(os.environ.get("DDP_CACHE", Path.home() / ".cache" / "ddp-operator"))


def state_dir() -> Path:
    """Where ``ddp-devcluster up`` records the running plane for ``down`` to find."""
    return Path(os.environ.get("DDP_CACHE_RUN", cache_dir() / "run"))
