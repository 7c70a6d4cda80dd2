"""A user's torchrun script that fails (``tests/trainer/test_trainer_node_unit.py``): local rank
0 raises at once; the other ranks wait until torchrun stops them, so no exception of theirs can
come before rank 0's however the ranks are scheduled (the order of interleaved tracebacks is
``LastWords``' unit test's)."""

import os
import time

if os.environ.get("LOCAL_RANK") == "0":
    raise ValueError("the corpus at /data/corpus.txt has no text")
time.sleep(600)  # torchrun stops this rank once rank 0 failed
