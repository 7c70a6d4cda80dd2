"""Progress records written by training pods, read as untrusted input: what the operator keeps of
a record (in a pod's annotation, or a job's progress ConfigMap), the checks a record passes
before it reaches ``status.progress``, and which of a job's records is the newest.

The record comes from code the operator does not control (the user's script, any library it
imports), so it is bounded before it is parsed, parsed strictly (no NaN, no unknown fields), and
every value is checked against the Progress schema and against the other values. A record that
fails is dropped whole, with the reason, and the previous progress stays.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ddp_api.contract import PROGRESS_ANNOTATION, PROGRESS_KEY, PROGRESS_SUFFIX, parse_rfc3339
from ddp_api.metav1 import controller_uid

MAX_RECORD_CHARS = 4096  # a real record is about 250; the ConfigMap itself may hold 1 MiB
MAX_COUNT = 2**53  # the largest integer a JSON number carries exactly
MAX_WORLD_SIZE = 1_000_000
MAX_TEXT = 253
INTEGERS = ("epoch", "step", "totalSteps", "worldSize", "groups", "heldAtStep")
NUMBERS = ("loss", "samplesPerSecond")
TEXTS = ("lastCheckpoint", "updatedAt")
FIELDS = INTEGERS + NUMBERS + TEXTS  # the fields of api.Progress that a record may carry
ETA = "estimatedRemainingSeconds"  # the fields of api.Progress that the operator computes
ETA_TEXT = "eta"  # the same, as a person reads it
COMPUTED = (ETA, ETA_TEXT)


@dataclass(frozen=True)
class Record:
    """What the operator's caches keep of one record (a pod's annotation, a ConfigMap's key)."""

    owner: str  # the uid of the DDPJob that owns the pod or ConfigMap ("" when none does)
    text: str | None  # the record; None when absent
    chars: int  # its length, kept when the text is too long to keep


def _record(owner: str, text: Any) -> Record:
    if not isinstance(text, str):
        return Record(owner, None, 0)
    return Record(owner, text if len(text) <= MAX_RECORD_CHARS else None, len(text))


def record_of(configmap: Mapping[str, Any]) -> Record:
    """A job's progress ConfigMap (where trainer pods run as the job's own account)."""
    meta = configmap.get("metadata") or {}
    return _record(controller_uid(meta), (configmap.get("data") or {}).get(PROGRESS_KEY))


def record_of_pod(pod: Mapping[str, Any]) -> Record | None:
    """The record in a pod's progress annotation (None: it has none). The pod may change that
    annotation and nothing else of itself (the admission policy), so its owner is the job's."""
    meta = pod.get("metadata") or {}
    text = (meta.get("annotations") or {}).get(PROGRESS_ANNOTATION)
    return None if text is None else _record(controller_uid(meta), text)


def job_of(configmap: Mapping[str, Any]) -> str | None:
    """The job a progress ConfigMap belongs to, by its name: a pod that may patch the ConfigMap
    may also relabel it, but cannot rename it, so the label is never trusted for this."""
    name = str((configmap.get("metadata") or {}).get("name", ""))
    return name.removesuffix(PROGRESS_SUFFIX) if name.endswith(PROGRESS_SUFFIX) else None


class Rejected(ValueError):
    """The record is not a valid progress report; the message says why."""


def _reject_constant(name: str) -> Any:
    raise Rejected(f"{name} is not a number JSON allows")


def _integer(key: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Rejected(f"{key} must be an integer, not {type(value).__name__}")
    if not low <= value <= high:
        raise Rejected(f"{key} must be between {low} and {high}, not {value}")
    return value


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Rejected(f"{key} must be a number, not {type(value).__name__}")
    if not math.isfinite(value) or abs(value) > MAX_COUNT:
        raise Rejected(f"{key} must be a finite number, not {value}")
    return float(value)


def _text(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise Rejected(f"{key} must be a string, not {type(value).__name__}")
    if len(value) > MAX_TEXT or not value.isprintable():
        raise Rejected(f"{key} must be printable text of at most {MAX_TEXT} characters")
    return value


def parse(record: Record) -> dict[str, Any]:
    """The progress of a record, every field of Progress present (None: unset, removed from
    the status by the merge patch); raises :class:`Rejected` naming the first problem."""
    if record.text is None:
        if record.chars:
            raise Rejected(f"the record is {record.chars} characters, over {MAX_RECORD_CHARS}")
        raise Rejected(f"data.{PROGRESS_KEY} is missing")
    try:
        raw = json.loads(record.text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise Rejected(f"the record is not JSON: {e.msg} at character {e.pos}") from e
    if not isinstance(raw, dict):
        raise Rejected(f"the record must be a JSON object, not {type(raw).__name__}")
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        what = "is not a field" if len(unknown) == 1 else "are not fields"
        raise Rejected(f"{', '.join(unknown[:5])} {what} of status.progress ({', '.join(FIELDS)})")
    out: dict[str, Any] = dict.fromkeys(FIELDS)
    for key, value in raw.items():
        if value is None:
            continue
        if key in INTEGERS:
            counts_members = key in ("worldSize", "groups")  # at least one trained the step
            high = MAX_WORLD_SIZE if counts_members else MAX_COUNT
            out[key] = _integer(key, value, 1 if counts_members else 0, high)
        elif key in NUMBERS:
            out[key] = _number(key, value)
            if key == "samplesPerSecond" and value < 0:
                raise Rejected(f"samplesPerSecond must not be negative, not {value}")
        else:
            out[key] = _text(key, value)
    if out["updatedAt"] is not None:
        try:
            parse_rfc3339(out["updatedAt"])
        except ValueError as e:
            raise Rejected(f"updatedAt must be a time like 2026-01-01T00:00:00Z: {e}") from e
    total = out["totalSteps"]
    for key in ("step", "heldAtStep"):
        if total is not None and out[key] is not None and out[key] > total:
            raise Rejected(f"{key} {out[key]} is beyond totalSteps {total}")
    return out


def order(progress: Mapping[str, Any]) -> tuple[str, int]:
    """How new a valid record is: its ``updatedAt`` (the reporting pod's clock, whole seconds,
    which sorts as text), then its step. Rank 0 may move to another pod (an elastic job), and
    the pod that held it keeps its last record: the newest of a job's records is its progress."""
    step = progress.get("step")
    return (progress.get("updatedAt") or "", -1 if step is None else int(step))


def older(progress: Mapping[str, Any], than: Mapping[str, Any] | None) -> bool:
    """Whether ``progress`` was reported before ``than`` (status.progress): a record left in a
    pod that is no longer rank 0 must not replace a newer one whose pod has gone. Records
    without ``updatedAt`` are never older."""
    mine, theirs = progress.get("updatedAt"), (than or {}).get("updatedAt")
    return bool(mine and theirs and mine < theirs)


def without_unset(progress: Mapping[str, Any] | None) -> dict[str, Any]:
    """Progress as the API server stores it: unset fields absent."""
    return {k: v for k, v in (progress or {}).items() if v is not None}


def remaining_seconds(
    previous: Mapping[str, Any] | None, new: Mapping[str, Any], *, across_incident: bool = False
) -> int | None:
    """The seconds a run needs until ``totalSteps`` at the pace between two reports (``previous``,
    what ``status.progress`` holds, and ``new``, a parsed record): None where they give no pace
    (no previous report, the step or the time did not advance: a hold, a resume from a
    checkpoint, a report repeated), or no total. The same report seen again keeps its value.
    ``across_incident``: an incident came between them, whose outage is no step time (the first
    step after a store was replaced was once read as 17 s a step, an ETA of an hour); the pace
    from before it is kept."""
    previous = previous or {}
    step, total, at = new.get("step"), new.get("totalSteps"), new.get("updatedAt")
    before, then = previous.get("step"), previous.get("updatedAt")
    if (step, at) == (before, then):
        value = previous.get(ETA)
        return value if isinstance(value, int) else None
    if across_incident:
        pace = step_seconds(previous)
        if pace <= 0 or step is None or total is None or step > total:
            return None
        return round((total - step) * pace)
    now_at, then_at = parse_rfc3339(at), parse_rfc3339(then)
    if step is None or total is None or before is None or now_at is None or then_at is None:
        return None
    seconds = (now_at - then_at).total_seconds()
    if new.get("heldAtStep") is not None or step <= before or seconds <= 0:
        return None
    return round((total - step) * seconds / (step - before))


def step_seconds(progress: Mapping[str, Any] | None) -> float:
    """The step time the last two reports showed (from the time they left), else 0."""
    p = progress or {}
    eta, step, total = p.get(ETA), p.get("step"), p.get("totalSteps")
    if eta is None or step is None or total is None or total <= step:
        return 0.0
    return float(eta) / (total - step)
