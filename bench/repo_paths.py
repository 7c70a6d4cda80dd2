"""Where a bench finds the project: its packages (the folders ``make`` puts on ``PYTHONPATH``) on
this process's path, with the test folders a bench borrows helpers from, and on the
``PYTHONPATH`` of the processes it starts."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("api", "client", "operator", "trainer_image", "devcluster")


def add(*folders: str) -> None:
    """The project's packages and ``folders`` (of the repository) first on ``sys.path``."""
    sys.path[:0] = [str(REPO / folder) for folder in (*PACKAGES, *folders)]


def pythonpath(root: Path = REPO) -> str:
    """``PYTHONPATH`` for a process that runs the packages of ``root`` (this checkout, or
    another revision's files)."""
    return os.pathsep.join(str(root / folder) for folder in PACKAGES)


def child_env(root: Path = REPO, /, **extra: str) -> dict[str, str]:
    """This process's environment without the trainer's settings (``DDPJOB_*``,
    ``DDP_TRAINER_*``), with the packages of ``root`` and one OpenMP thread; ``extra`` on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDPJOB_", "DDP_TRAINER_"))}
    env["PYTHONPATH"] = pythonpath(root)
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env
