"""`python -m ddp_trainer`: read the settings, then train (one torchrun worker, or alone; in
PerStep mode one process of a replica group: :mod:`ddp_trainer.per_step.trainer`)."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

from ddp_api.trainer_config import ConfigError, load_settings
from ddp_trainer.per_step.replicas import per_step


def _setup_logging() -> None:
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.INFO if rank == "0" else logging.WARNING,
        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,  # a worker forked from torchrun's agent has the agent's handlers
    )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config, checkpoint_dir = load_settings(argv)
    except ConfigError as error:
        print(f"ddp_trainer: invalid settings: {error}", file=sys.stderr)
        return 2
    _setup_logging()
    # torch is imported only once the settings are valid
    if per_step(os.environ):  # PerStep mode (DDPJOB_FAULT_TOLERANCE): a replica group
        from ddp_trainer.per_step.trainer import run_per_step

        return run_per_step(config, checkpoint_dir)
    from ddp_trainer.trainer import run

    return run(config, checkpoint_dir)


if __name__ == "__main__":
    from ddp_trainer.launch.exits import leave

    leave(main)
