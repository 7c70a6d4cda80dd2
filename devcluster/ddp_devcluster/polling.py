"""Waiting for a condition, for the tests, the demo and the benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(
    what: str,
    probe: Callable[[], T | None],
    timeout_s: float = 60,
    interval_s: float = 0.2,
    detail: Callable[[], str] | None = None,
) -> T:
    """Calls ``probe`` until it returns something truthy, and returns that.

    After ``timeout_s`` it raises AssertionError naming ``what``, the last value and, when
    given, ``detail()`` (logs, events: what to read next).
    """
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() >= deadline:
            break
        time.sleep(interval_s)
    extra = f"\n{detail()}" if detail is not None else ""
    raise AssertionError(
        f"timed out after {timeout_s:.0f}s waiting for {what} (last: {last!r}){extra}"
    )
