"""``python -m ddp_trainer.node ARGS...``: the command a node pod runs (the operator renders it):
torchrun under the supervisor that outlives a lost rendezvous store
(:mod:`ddp_trainer.launch.supervisor`)."""

from __future__ import annotations

import sys

from ddp_trainer.launch.supervisor import main

if __name__ == "__main__":
    sys.exit(main())
