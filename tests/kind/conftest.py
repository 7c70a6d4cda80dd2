"""Lets fixtures of tests/kind see whether their test failed (to collect logs and events)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    if outcome.get_result().failed:
        item.kind_failed = True  # type: ignore[attr-defined]
