"""A user's torchrun script that fails (``tests/trainer/test_trainer_node_unit.py``): local rank
0 raises at once; the other ranks raise something else a moment later, if torchrun has not
stopped them by then, as a peer's broken collective would."""

import os
import time

if os.environ.get("LOCAL_RANK") == "0":
    raise ValueError("the corpus at /data/corpus.txt has no text")
time.sleep(1.0)
raise RuntimeError("Connection reset by peer")
