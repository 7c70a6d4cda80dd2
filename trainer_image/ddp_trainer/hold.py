"""Hold points: training pauses after given steps until a release file appears in the checkpoint
folder, so a test (or a person debugging) acts at a known step whatever the machine's speed.

A run with ``holdAtSteps: [25]`` stops after optimizer step 25, once that step's checkpoint (if
one is due) is under way, says so in ``metrics.jsonl`` and in ``status.progress.heldAtStep``,
and waits until ``release-step-00000025`` exists in the checkpoint folder, for example::

    kubectl exec digits-node-0 -- touch /checkpoints/release-step-00000025

The file stays, so a restarted run that passes step 25 again goes on without stopping. SIGTERM
while held ends the run as it always does: rank 0 checkpoints the held step, then exits.

Holding at the last step pauses after training is complete: the final checkpoint and the
completion record are written and the ranks have passed their last collective, so each rank
waits on its own, and SIGTERM ends the wait (the worker exits 0: nothing is left to do). A
test loses or freezes a node there to see how the job ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # no torch at import: e2e tests import this module for its release files
    from ddp_trainer.reporting.stacks import StackWatch
    from ddp_trainer.reporting.tally import Tally

RELEASE_PREFIX = "release-step-"
POLL_S = 0.2


def release_name(step: int) -> str:
    return f"{RELEASE_PREFIX}{step:08d}"


def release(directory: Path | str, step: int) -> Path:
    """Releases the hold at ``step`` (creates its file); returns the file's path."""
    path = Path(directory) / release_name(step)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    return path


def is_released(directory: Path | str, step: int) -> bool:
    return (Path(directory) / release_name(step)).exists()


def holds_at(step: int, hold_steps: tuple[int, ...] | list[int], total_steps: int) -> bool:
    """Whether the run pauses after ``step`` while training (the last: :func:`holds_at_end`)."""
    return step in hold_steps and step < total_steps


def holds_at_end(step: int, hold_steps: tuple[int, ...] | list[int], total_steps: int) -> bool:
    """Whether the run pauses after training is complete (``step`` is its last one)."""
    return step in hold_steps and step >= total_steps


class Holds:
    """The holds of a run before its last step (that one is
    :func:`ddp_trainer.ending.hold_at_end`'s): every rank polls with the process that looks for
    the release file (``looks``), and SIGTERM on any of them stops the run."""

    def __init__(
        self,
        folder: Path,
        tally: Tally,
        stacks: StackWatch,
        agree: Callable[[list[bool]], list[bool]],
        stop_requested: threading.Event,
        looks: Callable[[], bool],
    ):
        self.folder, self.tally, self.stacks = folder, tally, stacks
        self.agree = agree  # each flag, set when it is set on some rank (a collective)
        self.stop_requested, self.looks = stop_requested, looks

    def wait(self, step: int) -> None:
        """Waits after ``step`` until its release file exists."""
        release = self.folder / release_name(step)
        released = self._released(release)
        if not released:
            self.tally.held(step, release, at_end=False)
            self.stacks.disarm()  # a hold is no hang
            while not released:
                time.sleep(POLL_S)
                released = self._released(release)
            self.stacks.arm()
            self.tally.released(step, at_end=False)

    def _released(self, release: Path) -> bool:
        """Whether the looking process sees ``release``, the same on every rank; raises
        :class:`~ddp_trainer.distributed.Interrupted` on SIGTERM anywhere."""
        from ddp_trainer.distributed import Interrupted  # torch: only once a run holds

        seen, here = self.looks() and release.exists(), self.stop_requested.is_set
        released, stop = self.agree([seen, here()])
        if stop:
            raise Interrupted("SIGTERM" if here() else "SIGTERM on another rank while held")
        return released
