"""Checkpoint folders on a failing disk, for tests: the real store, with a read or a write that
raises an OSError on cue."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddp_trainer.state.store import CheckpointStore, Entry


class FlakyReads(CheckpointStore):
    """Reading the checkpoint ``flaky`` raises EIO the first ``failures`` times."""

    def __init__(self, directory: Path, flaky: str, failures: int, keep: int = 3):
        super().__init__(directory, keep=keep, read_retry_s=(0.0, 0.0))
        self.flaky, self.failures, self.tries = flaky, failures, 0

    def load(self, entry: Entry) -> dict[str, Any]:
        if entry.name == self.flaky:
            self.tries += 1
            if self.tries <= self.failures:
                raise OSError(errno.EIO, "Input/output error", str(self.directory / entry.name))
        return super().load(entry)


class FailingWrite(CheckpointStore):
    """Writing the checkpoint of ``step`` fails once with ENOSPC; ``then`` runs just before."""

    def __init__(
        self, directory: Path, step: int, keep: int = 3, then: Callable[[], Any] = lambda: None
    ):
        super().__init__(directory, keep=keep)
        self.step, self.then, self.failed = step, then, False

    def write(self, step: int, state: dict[str, Any]) -> Entry:
        if step == self.step and not self.failed:
            self.failed = True
            self.then()
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(step, state)
