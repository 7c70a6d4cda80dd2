"""How long jobs take to start, as this process saw it: the start-up histograms (pods created,
first training step) observed once per job, for the milestones reached while it watched. What
counts as a milestone is pure (:mod:`~ddp_operator.bookkeeping`); this part remembers which are
still ahead of each job and observes them.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from ddp_api.contract import parse_rfc3339
from ddp_api.status import StatusFields

from . import bookkeeping
from .metrics import OperatorMetrics


@dataclass
class StartupTimes:
    metrics: OperatorMetrics
    ahead: dict[str, set[str]] = field(default_factory=dict)  # job uid -> milestones to time

    def observe(
        self,
        meta: dict[str, Any],
        status: StatusFields,
        before: set[str],
        made: set[str],
        nodes: int,
    ) -> None:
        """After a reconcile: ``before`` the job's worker pods that existed, ``made`` those it
        created, ``status`` the status it started from."""
        uid = meta.get("uid", "")
        if uid not in self.ahead:
            self.ahead[uid] = bookkeeping.milestones_to_time(status, len(before))
        ahead = self.ahead[uid]
        if not ahead:
            return
        reached = bookkeeping.milestones_reached(ahead, status, len(before | made), nodes)
        created = parse_rfc3339(meta.get("creationTimestamp"))
        if not reached or created is None:
            return
        age = max(0.0, (dt.datetime.now(dt.UTC) - created).total_seconds())
        if bookkeeping.PODS_CREATED in reached:
            self.metrics.job_pods_created.observe(age)
        if bookkeeping.FIRST_STEP in reached:
            self.metrics.job_first_step.observe(age)
        ahead -= reached

    def forget(self, uid: str) -> None:
        self.ahead.pop(uid, None)
