"""The end of a PerStep run for the groups that do not write it: the writer's completion record
(:func:`ddp_trainer.state.store.read_completion`) says training of this run is complete."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from ddp_trainer.distributed import Interrupted
from ddp_trainer.state.store import read_completion

log = logging.getLogger("ddp_trainer.trainer")  # the trainer's lines: people and tests grep them

COMPLETION_POLL_S = 0.2


def completed(folder: Path, run_id: str | None) -> bool:
    """Whether ``folder`` holds the completion record of the run ``run_id``."""
    done = read_completion(folder)
    return done is not None and done.run_id == run_id


def wait_for_completion(
    folder: Path, run_id: str | None, group_timeout_s: float, stop_requested: threading.Event
) -> bool:
    """A group that trained the last step but is not the writer waits for the writer's
    completion record; False: none came (the writer was lost), quorum again."""
    deadline = time.monotonic() + max(30.0, 10 * group_timeout_s)
    while time.monotonic() < deadline:
        if completed(folder, run_id):
            return True
        if stop_requested.is_set():
            raise Interrupted("SIGTERM")
        time.sleep(COMPLETION_POLL_S)
    log.warning("no completion record from the writer: quorum again to elect one")
    return False
