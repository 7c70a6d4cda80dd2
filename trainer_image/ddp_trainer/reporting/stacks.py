"""Every thread's Python stack in the log when a step takes too long, so that the log of a hung
job says where it hung before the operator restarts it for its progress deadline
(``spec.progressDeadlineSeconds``: a deadlocked collective, a stuck data loader, a hang in the
user's code that no timeout catches).

Each worker re-arms :func:`faulthandler.dump_traceback_later` after every step (from the first
on: the operator's deadline, too, counts from rank 0's first report): once a step has
taken :data:`BEFORE_DEADLINE` of the deadline, the interpreter's own watchdog thread writes every
thread's stack to stderr (the pod's log, with torchrun's rank prefix), and again each period
while the step does not end. The operator restarts the job at the deadline, a quarter of it
later. The deadline follows the operator's rule
(:func:`ddp_operator.planner.stall.progress_deadline_s`): the setting when given, else the larger
of :data:`FLOOR_S` and :data:`STEP_TIMES` times the step time.
"""

from __future__ import annotations

import faulthandler
import os

from ddp_api.contract import ENV_PROGRESS_DEADLINE

FLOOR_S = 600.0
STEP_TIMES = 10
BEFORE_DEADLINE = 0.75


def dump_after_s(setting: str | None, step_s: float) -> float | None:
    """Seconds into a step after which the stacks are written; None: never (deadline 0).
    ``setting`` is ``DDPJOB_PROGRESS_DEADLINE_S`` (unset or empty: the default rule)."""
    if setting:
        deadline = float(setting)
        if deadline <= 0:
            return None
    else:
        deadline = max(FLOOR_S, STEP_TIMES * step_s)
    return BEFORE_DEADLINE * deadline


class StackWatch:
    """Arms (after each step) and disarms (for a hold, at the end) the stack dump."""

    def __init__(self, setting: str | None = None):
        self.setting = os.environ.get(ENV_PROGRESS_DEADLINE) if setting is None else setting

    def arm(self, step_s: float = 0.0) -> None:
        after = dump_after_s(self.setting, step_s)
        if after is not None:
            faulthandler.dump_traceback_later(after, repeat=True)

    def disarm(self) -> None:
        faulthandler.cancel_dump_traceback_later()
