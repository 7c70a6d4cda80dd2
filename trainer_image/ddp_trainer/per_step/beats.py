"""Group beats: every replica group's local rank 0 writes, once a second, the steps it has
trained and the time, to ``<checkpoint folder>/groups/<index>.json``. A group that joins reads
them to tell "every group was lost" from "a live group is mid-step"
(:func:`~ddp_trainer.per_step.replicas.trained_elsewhere`): torchft's lighthouse issues a quorum
of a majority of the groups that heartbeat once its join timeout has passed, so two groups that
join while the only live group computes a step longer than that timeout get a quorum of their
own, at max step 0, which alone would read as "no live group to heal from"."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("ddp_trainer.trainer")

BEATS_FOLDER = "groups"
BEAT_EVERY_S = 1.0


def beat_path(folder: Path, group: int) -> Path:
    return folder / BEATS_FOLDER / f"{group}.json"


def read_beats(folder: Path) -> dict[int, tuple[int, float]]:
    """Every group's last beat: {index: (steps trained, time written)}; unreadable ones are
    left out (a beat is replaced atomically, so only a foreign file is)."""
    beats = {}
    with contextlib.suppress(OSError):
        for path in (folder / BEATS_FOLDER).glob("*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                row = json.loads(path.read_text())
                beats[int(path.stem)] = (int(row["step"]), float(row["time"]))
    return beats


class Beats:
    """The thread that writes this group's beat while the process lives (local rank 0)."""

    def __init__(self, folder: Path, group: int, step: Callable[[], int]):
        self.path, self.step = beat_path(folder, group), step
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ddp-group-beat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        temp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        said = made = False
        while not self._stop.is_set():
            try:
                if not made:  # once: not a round trip to the volume every second
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    made = True
                temp.write_text(json.dumps({"step": self.step(), "time": time.time()}))
                os.replace(temp, self.path)
            except OSError as error:  # a volume that fails: the folder's writes say more
                if not said:
                    log.warning("writing the group's beat %s failed: %s", self.path, error)
                    said = True
            self._stop.wait(BEAT_EVERY_S)
