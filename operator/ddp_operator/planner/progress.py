"""Rank 0's newest report: copied into the status, the start of the progress deadline, and the
incidents it ends; the policy reads the draft and returns its :class:`~.decision.Decision`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddp_api.contract import duration_text, rfc3339
from ddp_api.status import StatusFields

from .. import incidents, reports
from .decision import NOTHING, Decision
from .draft import Draft
from .stall import stepped_since_running


def take_report(st: Draft, progress: Mapping[str, Any] | None) -> Decision:
    """Copies rank 0's newest report (None: none) into the status when it differs, moves
    ``lastStepTime`` (from which the progress deadline counts) and closes the incidents a new
    report ends. Reads ``st`` only."""
    if progress is None:
        return NOTHING
    shown = st.status.get("progress")
    outage = any(incidents.is_open(i) for i in st.status.get("incidents") or [])
    eta = reports.remaining_seconds(shown, progress, across_incident=outage)
    text = None if eta is None else duration_text(eta)
    progress = {**progress, reports.ETA: eta, reports.ETA_TEXT: text}
    status = StatusFields()
    if reports.without_unset(progress) != reports.without_unset(shown):
        status["progress"] = progress  # None values: fields the merge patch removes
    fresh = progress.get("updatedAt") != (shown or {}).get("updatedAt")  # a new report
    moved = progress.get("step") != (shown or {}).get("step")
    if moved or (fresh and not stepped_since_running(st.status)):
        status["lastStepTime"] = rfc3339(st.now)  # the progress deadline counts from here
    if not fresh:
        return Decision(status=status)
    changes, closed = incidents.account(st.status, shown, progress)
    status.update(changes)
    return Decision(status=status, closed=tuple(closed))
