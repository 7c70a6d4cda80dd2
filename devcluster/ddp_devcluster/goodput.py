"""What incidents cost a run, from its run log alone (``metrics.jsonl``: one ``step`` row per
optimizer step that the reporting rank logged, with its wall ``time``). Pure: rows in,
numbers out; ``bench/goodput.py`` and the kind tests of per-step fault tolerance read them.

- **steps redone**: step rows whose step index is logged again later (Restart mode resumes
  from the newest checkpoint, so the steps after it are trained twice; per-step fault
  tolerance never logs an uncommitted step, so none);
- **stall** of an incident at time ``t``: the longest time without a step row from ``t``
  until the next incident (or the end): how long training stopped for it, whatever the
  survivors did meanwhile;
- **goodput**: time spent in steps that were kept (the last row of each step index), divided
  by the wall time from the first step row to the last. A kept step's time is the gap since
  the row before it, except where that gap spans an incident's stall (more than
  ``STALL_FACTOR`` times the median gap): then it counts as one median step.

All three may be taken over a window that ends at ``until`` (the benchmark's: one interval
after its last incident, so that incidents come at the same rate all through it, however fast
the run trains). A step in the window that is logged again after it (a restart just before
the window's end) still counts as redone, not kept.

Time the run spent held at a hold point (its ``hold`` and ``release`` rows, written when a test
paused it on purpose) is no one's stall and no wall time: every gap above leaves it out.

The operator's own moves of a PerStep group (:func:`moves`, read from the job's status, not
the run log) are incidents too: the callers add them to theirs.
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ddp_api.contract import parse_rfc3339
from ddp_api.ddpjob import IncidentKind

STALL_FACTOR = 3.0


@dataclass(frozen=True)
class StepRow:
    time: float
    step: int


def step_rows(rows: Iterable[Mapping[str, Any]]) -> list[StepRow]:
    """The run log's step rows in time order."""
    out = [
        StepRow(float(r["time"]), int(r["step"]))
        for r in rows
        if r.get("event") == "step" and "time" in r and "step" in r
    ]
    return sorted(out, key=lambda r: r.time)


Span = tuple[float, float]


def held_spans(rows: Iterable[Mapping[str, Any]]) -> list[Span]:
    """When the run was held: each ``hold`` row's time to the next ``release`` row's (to no
    end while none follows), in time order."""
    marks = sorted(
        (float(r["time"]), r["event"]) for r in rows if r.get("event") in ("hold", "release")
    )
    spans: list[Span] = []
    start: float | None = None
    for at, event in marks:
        if event == "hold" and start is None:
            start = at
        elif event == "release" and start is not None:
            spans.append((start, at))
            start = None
    if start is not None:
        spans.append((start, float("inf")))
    return spans


def _span(a: float, b: float, held: Sequence[Span] = ()) -> float:
    """Seconds from ``a`` to ``b`` that the run was not held."""
    inside = sum(max(0.0, min(b, end) - max(a, start)) for start, end in held)
    return b - a - inside


def _gaps(rows: Sequence[StepRow], held: Sequence[Span] = ()) -> list[float]:
    return [_span(a.time, b.time, held) for a, b in itertools.pairwise(rows)]


INF = float("inf")


def steps_redone(rows: Sequence[StepRow], until: float = INF) -> int:
    """Step rows up to ``until`` whose step index appears again in a later row."""
    last = {r.step: i for i, r in enumerate(rows)}
    return sum(1 for i, r in enumerate(rows) if last[r.step] != i and r.time <= until)


def stalls(
    rows: Sequence[StepRow],
    incidents: Sequence[float],
    held: Sequence[Span] = (),
    until: float = INF,
) -> list[float]:
    """Each incident's stall (seconds): the longest time without a step row from the incident
    until the next incident, or the last one until ``until`` (counting the gap that the first
    row after that closes), held time left out; 0 when no row follows it."""
    times = [r.time for r in rows]
    out = []
    ordered = sorted(incidents)
    for k, at in enumerate(ordered):
        next_at = ordered[k + 1] if k + 1 < len(ordered) else until
        first = bisect.bisect_right(times, at)  # the first row after the incident
        end = bisect.bisect_right(times, next_at)  # and the first row after the next one
        after = times[first : end + 1]
        gaps = [_span(a, b, held) for a, b in itertools.pairwise([at, *after])] if after else []
        out.append(max(gaps) if gaps else 0.0)
    return out


def goodput(rows: Sequence[StepRow], held: Sequence[Span] = (), until: float = INF) -> float:
    """Time in kept steps / wall time, from the first row to the last or to ``until``, held
    time left out of both (1.0 for a run with no incident and even steps)."""
    inside = [r for r in rows if r.time <= until]
    if len(inside) < 2:
        return 0.0
    gaps = _gaps(inside, held)
    typical = statistics.median(gaps)
    last = {r.step: i for i, r in enumerate(rows)}  # over the whole run: redone later is lost
    kept_s = 0.0
    for i in range(1, len(inside)):
        if last[inside[i].step] != i:
            continue
        gap = gaps[i - 1]
        kept_s += typical if gap > STALL_FACTOR * typical else gap
    end = until if len(inside) < len(rows) else rows[-1].time
    wall = _span(rows[0].time, end, held)
    return min(1.0, kept_s / wall) if wall > 0 else 0.0


def summary(
    rows: Iterable[Mapping[str, Any]], incidents: Sequence[float], until: float = INF
) -> dict[str, Any]:
    """The benchmark's figures of one run up to ``until``: stall p50/max over its incidents,
    steps redone, goodput, and the steps logged; time held at a hold point left out."""
    rows = list(rows)
    steps, held = step_rows(rows), held_spans(rows)
    each = stalls(steps, incidents, held, until)
    return {
        "survivor_stall_p50_s": round(statistics.median(each), 2) if each else None,
        "survivor_stall_max_s": round(max(each), 2) if each else None,
        "stalls_s": [round(s, 2) for s in each],
        "steps_redone": steps_redone(steps, until),
        "goodput": round(goodput(steps, held, until), 3),
        "steps_logged": sum(1 for r in steps if r.time <= until),
    }


def moves(status: Mapping[str, Any], since: float = 0.0) -> list[float]:
    """When the operator moved a PerStep group (the ``Rebalance`` incidents of a job's status,
    ``detectedAt``: whole seconds) from ``since`` on, as Unix times: incidents of their own,
    which the run log does not show."""
    at = [
        parse_rfc3339(i.get("detectedAt"))
        for i in status.get("incidents") or []
        if i.get("kind") == IncidentKind.REBALANCE
    ]
    return [t.timestamp() for t in at if t is not None and t.timestamp() >= since]
