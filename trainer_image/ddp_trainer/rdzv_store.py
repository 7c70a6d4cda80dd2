"""``python -m ddp_trainer.rdzv_store``: the command the job's rendezvous store pod runs (the
operator renders it; :mod:`ddp_trainer.launch.rdzv_store`)."""

from __future__ import annotations

import sys

from ddp_trainer.launch.rdzv_store import main

if __name__ == "__main__":
    sys.exit(main())
