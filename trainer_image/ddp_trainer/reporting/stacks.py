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

The local ranks of a pod share its stderr, and faulthandler writes a stack in many small writes:
two ranks dumping at once interleaved character by character ("Thread 0xThread 0x0000...", seen
in a 2-rank test). So local rank r dumps r spreads later (:data:`SPREAD_S`, less for a short
deadline: all of a pod's ranks within half of the deadline's last quarter).
"""

from __future__ import annotations

import faulthandler
import os

from ddp_api.contract import ENV_PROGRESS_DEADLINE

FLOOR_S = 600.0
STEP_TIMES = 10
BEFORE_DEADLINE = 0.75
SPREAD_S = 0.2  # between two local ranks' dumps (a dump of a few threads takes milliseconds)


def dump_after_s(
    setting: str | None, step_s: float, local_rank: int = 0, local_ranks: int = 1
) -> float | None:
    """Seconds into a step after which local rank ``local_rank`` of ``local_ranks`` writes the
    stacks; None: never (deadline 0). ``setting`` is ``DDPJOB_PROGRESS_DEADLINE_S`` (unset or
    empty: the default rule)."""
    if setting:
        deadline = float(setting)
        if deadline <= 0:
            return None
    else:
        deadline = max(FLOOR_S, STEP_TIMES * step_s)
    spread = min(SPREAD_S, (1 - BEFORE_DEADLINE) * deadline / (2 * max(local_ranks, 1)))
    return BEFORE_DEADLINE * deadline + local_rank * spread


class StackWatch:
    """Arms (after each step) and disarms (for a hold, at the end) the stack dump."""

    def __init__(self, setting: str | None = None, local_rank: int = 0, local_ranks: int = 1):
        self.setting = os.environ.get(ENV_PROGRESS_DEADLINE) if setting is None else setting
        self.local_rank, self.local_ranks = local_rank, local_ranks

    def arm(self, step_s: float = 0.0) -> None:
        after = dump_after_s(self.setting, step_s, self.local_rank, self.local_ranks)
        if after is not None:
            faulthandler.dump_traceback_later(after, repeat=True)

    def disarm(self) -> None:
        faulthandler.cancel_dump_traceback_later()
