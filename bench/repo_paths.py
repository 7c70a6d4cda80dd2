"""Where a bench finds the project: its packages (``ddp_devcluster.paths.SOURCE_DIRS``, the
folders ``make`` puts on ``PYTHONPATH``) on this process's path, with the test folders a bench
borrows helpers from, and on the ``PYTHONPATH`` of the processes it starts."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "devcluster") not in sys.path:  # run without make's PYTHONPATH
    sys.path.insert(0, str(REPO / "devcluster"))

from ddp_devcluster.paths import SOURCE_DIRS, source_path  # noqa: E402

__all__ = ["REPO", "SOURCE_DIRS", "add", "child_env", "source_path"]


def add(*folders: str) -> None:
    """The project's packages and ``folders`` (of the repository) first on ``sys.path``."""
    sys.path[:0] = [str(REPO / folder) for folder in (*SOURCE_DIRS, *folders)]


def child_env(root: Path = REPO, /, **extra: str) -> dict[str, str]:
    """This process's environment without the trainer's settings (``DDPJOB_*``,
    ``DDP_TRAINER_*``), with the packages of ``root`` and one OpenMP thread; ``extra`` on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDPJOB_", "DDP_TRAINER_"))}
    env["PYTHONPATH"] = source_path(root)
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env
