"""The controller's machines part without a server: a silent machine is marked for the planner,
heard again on its next Lease renewal (and marked since when, as an uncordoned one is), and a
thawed operator hears every machine afresh."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from ddp_api.contract import rfc3339
from ddp_operator.machines import Machines
from ddp_operator.planner import lost_machines


def node(name: str) -> dict[str, Any]:
    ready = {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-24T10:00:00Z"}
    return {"metadata": {"name": name}, "status": {"conditions": [ready]}}


def lease(name: str, renewed: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"renewTime": renewed}}


def renew(m: Machines, name: str, renewed: str) -> None:
    for key in m.leases.apply("MODIFIED", lease(name, renewed)):
        m._heartbeat(key)


def ticks(
    m: Machines, monkeypatch: pytest.MonkeyPatch, clock: list[float], advance: list[float]
) -> None:
    """Runs ``m``'s silence watch, moving ``clock`` (its monotonic time) by each value of
    ``advance`` between its ticks, and stops it after the last."""
    sleeps = iter(advance)

    async def sleep(_: float) -> None:
        try:
            clock[0] += next(sleeps)
        except StopIteration:
            raise asyncio.CancelledError from None

    monkeypatch.setattr(asyncio, "sleep", sleep)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(m.watch_silence())


def test_a_silent_machine_is_marked_until_its_lease_is_renewed() -> None:
    changed: list[tuple[str, str]] = []
    m = Machines(grace_s=30, changed=changed.append)
    for n in ("a", "b"):
        m.nodes.apply("ADDED", node(n))
        renew(m, n, "2026-11-24T10:00:00Z")
    assert {v.silent_since for v in m.views().values()} == {""}
    # Silent past the grace: what watch_silence does on its tick.
    mono, wall = m.heard["a"]
    m.heard["a"] = (mono - 60, wall)
    heard = {n: t for n, (t, _) in m.heard.items()}
    assert lost_machines.silent_machines(heard, time.monotonic(), m.grace_s) == {"a"}
    m.silent["a"] = "2026-11-24T10:00:00Z"
    assert m.views()["a"].silent_since == "2026-11-24T10:00:00Z"
    assert m.views()["b"].silent_since == ""
    assert m.views()["a"].back_since == ""
    renew(m, "a", "2026-11-24T10:01:00Z")
    assert m.silent == {} and m.views()["a"].silent_since == ""
    assert changed == [("", "a")]
    # Heard again: since when, on the operator's clock (its Node never said it was away).
    assert m.views()["a"].back_since == rfc3339(m.heard["a"][1])
    assert m.views()["b"].back_since == ""
    renew(m, "b", "2026-11-24T10:00:00Z")  # the same renewTime: not a heartbeat
    assert changed == [("", "a")]


def test_the_watch_marks_a_silent_machine_and_a_thawed_operator_hears_all_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    changed: list[tuple[str, str]] = []
    m = Machines(grace_s=30, changed=changed.append)
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    m.nodes.apply("ADDED", node("a"))
    renew(m, "a", "2026-11-24T10:00:00Z")

    # The operator itself stopped for 100 s: nothing is silent, every machine heard afresh.
    ticks(m, monkeypatch, clock, [100.0, 2.0])
    assert m.silent == {} and changed == [] and m.heard["a"][0] == 1100.0
    # Then 2 s ticks without a renewal: silent once 30 s have passed, reported once.
    ticks(m, monkeypatch, clock, [2.0] * 20)
    assert list(m.silent) == ["a"] and changed == [("", "a")]
    assert m.views()["a"].silent_since == m.silent["a"]


def test_no_machine_is_silent_while_the_api_server_is_not_ready_and_all_are_heard_afresh_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An API server down for 60 s (its machine powered off, or restarted): no kubelet could
    renew its Lease, and on kind the operator took every machine for lost as it came back."""
    changed: list[tuple[str, str]] = []
    m = Machines(grace_s=12, changed=changed.append)
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    ready = [True]

    async def hearing() -> bool:
        return ready[0]

    m.hearing = hearing
    for n in ("a", "b"):
        m.nodes.apply("ADDED", node(n))
        renew(m, n, "2026-11-24T10:00:00Z")

    ready[0] = False
    ticks(m, monkeypatch, clock, [2.0] * 30)  # 60 s: the Leases look 60 s old, past the 20 s floor
    assert m.silent == {} and changed == [] and m.deaf_since == 1000.0
    ready[0] = True  # back: every machine heard afresh, from now
    ticks(m, monkeypatch, clock, [2.0] * 5)
    assert m.silent == {} and changed == [] and m.deaf_since is None
    assert {t for t, _ in m.heard.values()} == {1060.0}
    renew(m, "b", "2026-11-24T10:01:10Z")  # b's kubelet renews; a's never does
    ticks(m, monkeypatch, clock, [2.0] * 8)
    assert list(m.silent) == ["a"] and changed == [("", "a")]
    # A blip shorter than DEAF_S hears nothing afresh: a's silence stands.
    ready[0] = False
    ticks(m, monkeypatch, clock, [1.0])
    assert m.deaf_since is None and list(m.silent) == ["a"]


def test_an_uncordoned_machine_is_back_from_then() -> None:
    changed: list[tuple[str, str]] = []
    m = Machines(grace_s=30, changed=changed.append)

    def see(name: str, cordoned: bool) -> None:
        body = node(name)
        body["spec"] = {"unschedulable": True} if cordoned else {}
        for key in m.nodes.apply("MODIFIED", body):
            m._node(key)

    see("a", cordoned=False)
    see("b", cordoned=True)  # kubectl drain
    assert m.views()["b"].unschedulable and m.views()["b"].back_since == ""
    see("b", cordoned=False)  # kubectl uncordon
    assert not m.views()["b"].unschedulable and m.views()["b"].back_since != ""
    assert m.views()["a"].back_since == ""  # never cordoned
    assert changed == [("", "a"), ("", "b"), ("", "b")]
    for key in m.nodes.apply("DELETED", node("b")):
        m._node(key)
    assert "b" not in m.back and "b" not in m.views()
