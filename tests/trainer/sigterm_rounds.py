"""A torchrun worker for the SIGTERM test: one process trains in rounds, each a new Trainer on the
same process group that resumes from the previous round's checkpoint and trains until SIGTERM.

A round thus costs a Trainer, not a worker start (seconds of imports per process): the test can
signal a 2-node x 2-process run many times. Between rounds the worker ignores SIGTERM and waits for
the test's go-ahead (the file ``go-<round>`` in the checkpoint folder), so a signal meant for one
round never lands in the next. The last round ends the process with the trainer's exit code.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from ddp_api.trainer_config import load_settings
from ddp_trainer.__main__ import _setup_logging
from ddp_trainer.distributed import DistEnv, init_distributed
from ddp_trainer.trainer import Trainer

ENV_ROUNDS = "SIGTERM_ROUNDS"


def main() -> int:
    config, checkpoint_dir = load_settings(sys.argv[1:])
    _setup_logging()
    env = DistEnv.from_env()
    init_distributed(env, config)
    code = 0
    for round_ in range(int(os.environ[ENV_ROUNDS])):
        go = checkpoint_dir / f"go-{round_}"
        while not go.exists():
            time.sleep(0.05)
        code = Trainer(config, checkpoint_dir, env).train()  # installs its SIGTERM handler
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # until the next round's trainer
        print(f"round {round_}: rank {env.rank} exit code {code}", flush=True)
        if code != 143:
            break
    return code


if __name__ == "__main__":
    sys.exit(main())
