"""PerStep mode's test hooks (off unless set): ``DDPJOB_SAMPLE_LOG`` (a folder: each process
appends the sample indices it fed and the steps it committed), ``DDPJOB_TEST_STOP_AT`` (a file
naming a phase: ``start``, ``quorum``, ``serve``, ``heal``, ``forward``, ``allreduce``,
``commit``, ``save`` (the writer's, before a checkpoint), or ``<phase>@<n>``: that phase once
the process has trained n steps; the process writes ``<file>.reached`` there and waits while the
file names it) and ``DDPJOB_TEST_STEP_S`` (a file holding seconds: while it does, the process
starts a step at most that often, so that a test's scene takes about as many steps on a fast
machine as on a slow one)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV_SAMPLE_LOG = "DDPJOB_SAMPLE_LOG"
ENV_STOP_AT = "DDPJOB_TEST_STOP_AT"
ENV_STEP_S = "DDPJOB_TEST_STEP_S"


class SampleLog:
    """``DDPJOB_SAMPLE_LOG``: one JSON line per step this process fed and per step it committed
    (with fp16, the GradScaler's scale and growth count after it), in a file of its own
    (appended, flushed per line: a SIGKILL loses nothing written)."""

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
    the file. ``steps`` gives the steps the process has trained, which ``<phase>@<n>`` waits
    for: a test holds a group at a chosen step without racing it."""

    def __init__(self, path: str | None, steps: Callable[[], int] = lambda: 0):
        self.path, self.steps = path, steps

    def __call__(self, name: str) -> None:
        if self.path is None or self._names(name) is False:
            return
        Path(self.path + ".reached").write_text(f"{name} {os.getpid()}\n")
        while self._names(name):
            time.sleep(0.05)

    def _names(self, phase: str) -> bool:
        try:
            said = Path(str(self.path)).read_text().strip()
        except OSError:
            return False
        name, at, steps = said.partition("@")
        return name == phase and (not at or steps == str(self.steps()))


class StepPace:
    """``DDPJOB_TEST_STEP_S``: while its file holds a number of seconds, each step of the
    process starts at least that long after the one before (a sleep before its quorum). A test
    that kills groups between steps then spends about as many steps per kill on any machine; a
    pause shorter than the lighthouse's join timeout keeps a joining group from forming a
    quorum without the paced ones. Returns the seconds it slept (its sample log says so: such
    a wait is the test's, not a stall)."""

    def __init__(self, path: str | None):
        self.path = path
        self.last: float | None = None

    def __call__(self) -> float:
        now = time.monotonic()
        seconds = self._seconds()
        wait = 0.0 if self.last is None else max(0.0, self.last + seconds - now)
        if wait > 0:
            time.sleep(wait)
        self.last = now + wait
        return wait

    def _seconds(self) -> float:
        if self.path is None:
            return 0.0
        try:
            return float(Path(self.path).read_text().strip() or 0)
        except (OSError, ValueError):
            return 0.0
