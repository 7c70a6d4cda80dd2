"""Rank 0's progress records as the operator receives them: the annotation ``ddp.dev/progress``
of each of a job's pods (kept in the pod cache's views), the job's ConfigMap ``<job>-progress``
where its pods run as the job's own account (watched into a cache of its own), and the newest
record of each pod that is gone; each parsed and checked (:mod:`~ddp_operator.reports`), the
newest valid one the job's progress, and a refused record said once (an Event per refused
record, not per reconcile).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ddp_api import contract

from . import informer, render, reports
from .planner.views import PodView

Key = tuple[str, str]


@dataclass
class ProgressRecords:
    cache: informer.Cache[reports.Record] = field(
        default_factory=lambda: informer.Cache(render.LABEL_JOB, reports.record_of, reports.job_of)
    )
    rejected: dict[tuple[str, str], str] = field(default_factory=dict)  # (job uid, where) -> text
    # Job uid -> the newest valid record of its pods that have left the pod cache: a pod deleted
    # right after its last report (a scale-down, a suspend) must not take that report with it.
    departed: dict[str, dict[str, Any]] = field(default_factory=dict)

    def latest(
        self,
        key: Key,
        uid: str,
        pods: Iterable[PodView],
        current: Mapping[str, Any] | None,
    ) -> tuple[dict[str, Any] | None, list[str]]:
        """The job's newest valid record, when it is no older than ``current``
        (status.progress; None: none yet, refused, or older), and why each record refused was
        refused, when that is news."""
        sources: list[tuple[str, reports.Record]] = []
        configmap = next(iter(self.cache.get(key)), None)
        # The owner's uid must be the job's: a namesake's leftover is ignored until collected;
        # the empty ConfigMap the operator made holds nothing reported yet.
        if (
            configmap is not None
            and configmap.owner == uid
            and (configmap.text is not None or configmap.chars)
        ):
            sources.append((f"ConfigMap {contract.progress_configmap(key[1])}", configmap))
        for view in pods:
            if view.progress is not None and view.progress.owner == uid:
                where = f"annotation {contract.PROGRESS_ANNOTATION} of pod {view.name}"
                sources.append((where, view.progress))
        valid = [self.departed[uid]] if uid in self.departed else []
        refused: list[str] = []
        for where, record in sources:
            try:
                valid.append(reports.parse(record))
            except reports.Rejected as e:
                seen = record.text or str(record.chars)
                if self.rejected.get((uid, where)) != seen:
                    self.rejected[(uid, where)] = seen
                    why = f"ignored the progress in {where}: {e}"
                    refused.append(f"{why}; status.progress keeps the last valid report")
            else:
                self.rejected.pop((uid, where), None)
        newest = max(valid, key=reports.order, default=None)
        if newest is None or reports.older(newest, current):
            return None, refused
        return newest, refused

    def pod_removed(self, key: Key, view: PodView) -> None:
        """Keeps the record of a pod that left the cache when it is its job's newest so far."""
        record = view.progress
        if record is None or not record.owner:
            return
        try:
            progress = reports.parse(record)
        except reports.Rejected:
            return
        kept = self.departed.get(record.owner)
        if kept is None or reports.order(progress) >= reports.order(kept):
            self.departed[record.owner] = progress

    def forget(self, uid: str) -> None:
        self.departed.pop(uid, None)
        for seen in [k for k in self.rejected if k[0] == uid]:
            del self.rejected[seen]
