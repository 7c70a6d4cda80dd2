"""Progress records written by training pods, read as untrusted input: what the operator keeps of
a job's progress ConfigMap, and the checks a record passes before it reaches ``status.progress``.

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

from ddp_api.contract import PROGRESS_KEY, PROGRESS_SUFFIX, parse_rfc3339

MAX_RECORD_CHARS = 4096  # a real record is about 250; the ConfigMap itself may hold 1 MiB
MAX_COUNT = 2**53  # the largest integer a JSON number carries exactly
MAX_WORLD_SIZE = 1_000_000
MAX_TEXT = 253
INTEGERS = ("epoch", "step", "totalSteps", "worldSize", "heldAtStep")
NUMBERS = ("loss", "samplesPerSecond")
TEXTS = ("lastCheckpoint", "updatedAt")
FIELDS = INTEGERS + NUMBERS + TEXTS  # the fields of api.Progress that a record may carry
ETA = "estimatedRemainingSeconds"  # the field of api.Progress that the operator computes


@dataclass(frozen=True)
class Record:
    """What the operator's cache keeps of one progress ConfigMap."""

    owner: str  # the uid of the DDPJob that owns it ("" when none does)
    text: str | None  # data.progress; None when absent
    chars: int  # its length, kept when the text is too long to keep


def record_of(configmap: Mapping[str, Any]) -> Record:
    meta = configmap.get("metadata") or {}
    owner = next(
        (r.get("uid", "") for r in meta.get("ownerReferences") or [] if r.get("controller")), ""
    )
    text = (configmap.get("data") or {}).get(PROGRESS_KEY)
    if not isinstance(text, str):
        return Record(owner, None, 0)
    return Record(owner, text if len(text) <= MAX_RECORD_CHARS else None, len(text))


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
            raise Rejected(f"{PROGRESS_KEY} is {record.chars} characters, over {MAX_RECORD_CHARS}")
        raise Rejected(f"data.{PROGRESS_KEY} is missing")
    try:
        raw = json.loads(record.text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise Rejected(f"{PROGRESS_KEY} is not JSON: {e.msg} at character {e.pos}") from e
    if not isinstance(raw, dict):
        raise Rejected(f"{PROGRESS_KEY} must be a JSON object, not {type(raw).__name__}")
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        what = "is not a field" if len(unknown) == 1 else "are not fields"
        raise Rejected(f"{', '.join(unknown[:5])} {what} of status.progress ({', '.join(FIELDS)})")
    out: dict[str, Any] = dict.fromkeys(FIELDS)
    for key, value in raw.items():
        if value is None:
            continue
        if key in INTEGERS:
            high = MAX_WORLD_SIZE if key == "worldSize" else MAX_COUNT
            out[key] = _integer(key, value, 1 if key == "worldSize" else 0, high)
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


def without_unset(progress: Mapping[str, Any] | None) -> dict[str, Any]:
    """Progress as the API server stores it: unset fields absent."""
    return {k: v for k, v in (progress or {}).items() if v is not None}


def remaining_seconds(previous: Mapping[str, Any] | None, new: Mapping[str, Any]) -> int | None:
    """The seconds a run needs until ``totalSteps`` at the pace between two reports (``previous``,
    what ``status.progress`` holds, and ``new``, a parsed record): None where they give no pace
    (no previous report, the step or the time did not advance: a hold, a resume from a
    checkpoint, a report repeated), or no total. The same report seen again keeps its value."""
    previous = previous or {}
    step, total, at = new.get("step"), new.get("totalSteps"), new.get("updatedAt")
    before, then = previous.get("step"), previous.get("updatedAt")
    if (step, at) == (before, then):
        value = previous.get(ETA)
        return value if isinstance(value, int) else None
    now_at, then_at = parse_rfc3339(at), parse_rfc3339(then)
    if step is None or total is None or before is None or now_at is None or then_at is None:
        return None
    seconds = (now_at - then_at).total_seconds()
    if new.get("heldAtStep") is not None or step <= before or seconds <= 0:
        return None
    return round((total - step) * seconds / (step - before))
