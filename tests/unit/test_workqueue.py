"""The controller's work queue without a server: one reconcile of a job at a time, events during
one cause exactly one more, jobs wait for their namespace's caches, a failure is retried later,
and a replica that does not lead reconciles nothing until it does, then every job at once; a
replica that stops lets the reconciles in flight end and starts none."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ddp_operator.kube import NotLeading
from ddp_operator.workqueue import RETRY_S, Key, WorkQueue

KEY: Key = ("ns", "job")


class Harness:
    def __init__(self) -> None:
        self.bodies: dict[Key, list[dict[str, Any]]] = {KEY: [{"v": 1}]}
        self.seen: list[Any] = []
        self.ready_ns: set[str] = {"ns"}
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail: Exception | None = None
        self.leads = True
        self.tasks: list[asyncio.Task[None]] = []
        self.took: list[float] = []
        self.queue = WorkQueue(
            self.reconcile,
            lambda key: self.bodies.get(key, []),
            lambda: list(self.bodies),
            lambda ns: ns in self.ready_ns,
            lambda coro: self.tasks.append(asyncio.get_running_loop().create_task(coro)),
            self.took.append,
            lambda: self.leads,
        )

    def changed(self, key: Key) -> None:
        """An event: enqueued in the background, as the controller does."""
        self.tasks.append(asyncio.get_running_loop().create_task(self.queue.enqueue(key)))

    async def reconcile(self, body: dict[str, Any]) -> None:
        self.seen.append(body["v"])
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail


def test_events_during_a_reconcile_cause_one_more_on_the_newest_body() -> None:
    async def run() -> Harness:
        h = Harness()
        h.gate.clear()
        first = asyncio.create_task(h.queue.enqueue(KEY))
        await asyncio.sleep(0)
        assert h.seen == [1] and h.queue.depth() == 1
        h.bodies[KEY] = [{"v": 2}]
        for _ in range(3):  # three events while it runs ...
            await h.queue.enqueue(KEY)
        h.gate.set()
        await first
        return h

    h = asyncio.run(run())
    assert h.seen == [1, 2]  # ... one more reconcile, of the newest state
    assert len(h.took) == 2 and h.queue.depth() == 0


def test_a_job_waits_for_its_namespace_caches_and_runs_on_release() -> None:
    async def run() -> Harness:
        h = Harness()
        h.ready_ns.clear()
        await h.queue.enqueue(KEY)
        assert h.seen == [] and h.queue.waiting == {KEY}
        h.queue.release("other")
        assert h.queue.waiting == {KEY}
        h.ready_ns.add("ns")
        h.queue.release("ns")
        await asyncio.gather(*h.tasks)
        return h

    h = asyncio.run(run())
    assert h.seen == [1] and not h.queue.waiting


def test_a_failed_reconcile_is_due_again_and_a_gone_job_is_not_reconciled() -> None:
    async def run() -> Harness:
        h = Harness()
        h.fail = RuntimeError("boom")
        await h.queue.enqueue(KEY)
        assert 0 < h.queue.due[KEY] - time.monotonic() <= RETRY_S
        h.queue.later(KEY, None)
        assert KEY not in h.queue.due
        h.bodies.clear()
        await h.queue.enqueue(KEY)  # deleted meanwhile: nothing to reconcile
        return h

    h = asyncio.run(run())
    assert h.seen == [1]


def test_a_standby_reconciles_nothing_and_every_job_once_it_leads() -> None:
    other: Key = ("ns", "other")

    async def run() -> Harness:
        h = Harness()
        h.bodies[other] = [{"v": 7}]
        h.leads = False
        await h.queue.enqueue(KEY)  # an event on a standby: the leader acts on it
        h.queue.later(KEY, 0.0)
        assert h.seen == [] and not h.queue.waiting
        h.leads = True
        h.queue.everything()  # it leads now: every job, without waiting for an event
        await asyncio.gather(*h.tasks)
        assert sorted(h.seen) == [1, 7] and not h.queue.due
        # The Lease lapses mid-reconcile: the write refused ends it, no retry is scheduled.
        h.fail = NotLeading("PATCH /x: not sent, this replica does not lead")
        await h.queue.enqueue(KEY)
        assert KEY not in h.queue.due
        return h

    asyncio.run(run())


def test_drain_lets_the_running_reconcile_end_and_starts_no_other() -> None:
    """A replica stopping gracefully: the reconcile in flight ends whole (its status, pods and
    Events), one asked for meanwhile never starts, nor does any other job's."""
    other: Key = ("ns", "other")

    async def run() -> Harness:
        h = Harness()
        h.bodies[other] = [{"v": 7}]
        h.gate.clear()
        first = asyncio.create_task(h.queue.enqueue(KEY))
        await asyncio.sleep(0)
        assert h.seen == [1]
        draining = asyncio.create_task(h.queue.drain(60.0))
        await asyncio.sleep(0)
        h.bodies[KEY] = [{"v": 2}]
        h.changed(KEY)  # an event during the drain: no second reconcile
        h.changed(other)  # nor one of another job
        h.queue.everything()
        for _ in range(5):
            await asyncio.sleep(0)
        assert not draining.done() and h.queue.active == {KEY}
        h.gate.set()
        await first
        await asyncio.wait_for(draining, 5.0)
        await asyncio.gather(*h.tasks)
        return h

    h = asyncio.run(run())
    assert h.seen == [1] and not h.queue.active


def test_drain_gives_up_on_a_reconcile_that_does_not_end() -> None:
    async def run() -> Harness:
        h = Harness()
        h.gate.clear()  # never set: the reconcile hangs
        stuck = asyncio.create_task(h.queue.enqueue(KEY))
        await asyncio.sleep(0)
        await asyncio.wait_for(h.queue.drain(0.05), 5.0)
        assert h.queue.active == {KEY}  # still there: the caller stops anyway
        stuck.cancel()
        return h

    h = asyncio.run(run())
    assert h.seen == [1]
