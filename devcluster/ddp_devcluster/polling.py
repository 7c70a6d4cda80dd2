"""Waiting for a condition, for the tests, the demo and the benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class TimedOut(AssertionError, TimeoutError):
    """A wait that gave up: a failed assertion to pytest, a TimeoutError to a tool."""


def until(
    what: str,
    probe: Callable[[], T | None],
    timeout_s: float = 60,
    interval_s: float = 0.2,
    detail: Callable[[], str] | None = None,
    progress: Callable[[], object] | None = None,
) -> T:
    """Calls ``probe`` until it returns something truthy, and returns that.

    After ``timeout_s`` it raises TimedOut naming ``what``, the last value and, when given,
    ``detail()`` (logs, events: what to read next). With ``progress``, ``timeout_s`` is a stall
    timeout: it counts from the last poll at which ``progress()`` changed, so a slow or busy
    machine is no failure, a stuck one is.
    """
    deadline = time.monotonic() + timeout_s
    seen: object = None
    last: T | None = None
    while True:
        last = probe()
        if last:
            return last
        if progress is not None and (now := progress()) != seen:
            seen, deadline = now, time.monotonic() + timeout_s
        if time.monotonic() >= deadline:
            break
        time.sleep(interval_s)
    extra = f"\n{detail()}" if detail is not None else ""
    wait = f"{what}: nothing moved for" if progress is not None else f"{what} after"
    raise TimedOut(f"timed out waiting for {wait} {timeout_s:.0f}s (last: {last!r}){extra}")
