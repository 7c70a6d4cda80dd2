"""PerStep mode's test hooks (off unless set): ``DDPJOB_SAMPLE_LOG`` (a folder: each process
appends the sample indices it fed and the steps it committed) and ``DDPJOB_TEST_STOP_AT`` (a file
naming a phase: ``start``, ``quorum``, ``serve``, ``heal``, ``forward``, ``allreduce``,
``commit``; the process writes ``<file>.reached`` there and waits while the file names it)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

ENV_SAMPLE_LOG = "DDPJOB_SAMPLE_LOG"
ENV_STOP_AT = "DDPJOB_TEST_STOP_AT"


class SampleLog:
    """``DDPJOB_SAMPLE_LOG``: one JSON line per step this process fed and per step it committed,
    in a file of its own (appended, flushed per line: a SIGKILL loses nothing written)."""

    def __init__(self, folder: str | None, name: str):
        self.file = None
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            path = Path(folder) / f"{name}-{os.getpid()}.jsonl"
            self.file = open(path, "a", buffering=1)  # noqa: SIM115 (lives as long as the run)

    def write(self, **fields: Any) -> None:
        if self.file is not None:
            self.file.write(json.dumps({"time": round(time.time(), 4), **fields}) + "\n")


class StopAt:
    """``DDPJOB_TEST_STOP_AT``: while its file names a phase the process reaches, say so
    (``<file>.reached``) and wait: a test kills the group there, or lets it go on by changing
    the file."""

    def __init__(self, path: str | None):
        self.path = path

    def __call__(self, name: str) -> None:
        if self.path is None or self._names(name) is False:
            return
        Path(self.path + ".reached").write_text(f"{name} {os.getpid()}\n")
        while self._names(name):
            time.sleep(0.05)

    def _names(self, phase: str) -> bool:
        try:
            return Path(str(self.path)).read_text().strip() == phase
        except OSError:
            return False
