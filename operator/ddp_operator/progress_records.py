"""Rank 0's progress records as the operator receives them: each job's ConfigMap
``<job>-progress`` (watched into a cache), parsed and checked (:mod:`~ddp_operator.reports`),
and a refused record said once (an Event per refused record, not per reconcile).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddp_api import contract

from . import informer, render, reports

Key = tuple[str, str]


@dataclass
class ProgressRecords:
    cache: informer.Cache[reports.Record] = field(
        default_factory=lambda: informer.Cache(render.LABEL_JOB, reports.record_of, reports.job_of)
    )
    rejected: dict[str, str] = field(default_factory=dict)  # job uid -> last record refused

    def latest(self, key: Key, uid: str) -> tuple[dict[str, Any] | None, str]:
        """The job's newest valid record (None: none yet, or refused), and why it was refused
        when that is news."""
        record = next(iter(self.cache.get(key)), None)
        if record is None or record.owner != uid:  # none, or a namesake's not yet collected
            return None, ""
        try:
            progress = reports.parse(record)
        except reports.Rejected as e:
            if record.text is None and not record.chars:
                return None, ""  # the empty ConfigMap the operator made: nothing reported yet
            seen = record.text or str(record.chars)
            if self.rejected.get(uid) == seen:
                return None, ""
            self.rejected[uid] = seen
            name = contract.progress_configmap(key[1])
            why = f"ignored the progress in ConfigMap {name}: {e}"
            return None, f"{why}; status.progress keeps the last valid report"
        self.rejected.pop(uid, None)
        return progress, ""

    def forget(self, uid: str) -> None:
        self.rejected.pop(uid, None)
