"""The controller's work queue of jobs, as in Kubernetes' own controllers: at most one reconcile
of a job runs at a time and events that arrive meanwhile cause one more, on the newest state; a
job seen before its namespace's caches are filled waits for them (planning from empty caches
would recreate what exists); a clock reconciles what is due (backoff, deadlines, TTL: ends by
time, not by an event) and, every resync, every job. A replica that does not lead reconciles
nothing (:mod:`ddp_operator.leadership`); once it leads, :meth:`WorkQueue.everything` at once.
A replica that stops gracefully first drains it (:meth:`WorkQueue.drain`): no reconcile starts, and
those running end (a counted failure's Events posted, its status written, its pods replaced)
before the replica stops writing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from .kube import NotLeading, until_idle

log = logging.getLogger("ddp_operator")

Key = tuple[str, str]
RETRY_S = 5.0  # a reconcile that raised is tried again this much later


@dataclass
class WorkQueue:
    reconcile: Callable[[dict[str, Any]], Awaitable[None]]
    bodies: Callable[[Key], list[dict[str, Any]]]  # the job's newest body; [] once it is gone
    jobs: Callable[[], list[Key]]  # every job known (a resync's keys)
    ready: Callable[[str], bool]  # the caches of a namespace are filled
    spawn: Callable[[Coroutine[Any, Any, None]], None]
    took: Callable[[float], None]  # seconds of each reconcile (a metric)
    acting: Callable[[], bool] = lambda: True  # this replica leads
    active: set[Key] = field(default_factory=set)  # jobs being reconciled now
    again: set[Key] = field(default_factory=set)  # ... that had events meanwhile
    waiting: set[Key] = field(default_factory=set)  # jobs seen before their caches were filled
    due: dict[Key, float] = field(default_factory=dict)  # monotonic time of the next check
    closed: bool = False  # draining: no reconcile starts any more

    async def enqueue(self, key: Key) -> None:
        """Reconciles ``key`` now, or once more after the reconcile that is running."""
        if not self.acting() or self.closed:
            return  # a standby: the leader reconciles it; every job is, when this one leads
        if not self.ready(key[0]):
            self.waiting.add(key)
            return
        if key in self.active:
            self.again.add(key)
            return
        self.active.add(key)
        try:
            while True:
                self.again.discard(key)
                bodies = self.bodies(key)
                if not bodies or not self.acting() or self.closed:
                    break
                started = time.perf_counter()
                try:
                    await self.reconcile(bodies[0])
                except NotLeading as e:  # the Lease lapsed mid-reconcile: nothing more is sent
                    log.info("reconcile of %s/%s stopped: %s", *key, e)
                except Exception:
                    log.exception("reconcile of %s/%s failed; retrying in %.0fs", *key, RETRY_S)
                    self.due[key] = time.monotonic() + RETRY_S
                self.took(time.perf_counter() - started)
                if key not in self.again:
                    break
        finally:
            self.active.discard(key)

    async def drain(self, timeout_s: float) -> None:
        """Starts no reconcile any more, and returns once none runs, or after ``timeout_s``.

        Before a replica that stops gracefully stops writing, so that a reconcile under way
        ends whole (a counted failure's Events, its status, its pods) instead of leaving the
        rest to the next leader."""
        self.closed = True
        await until_idle(lambda: self.active, timeout_s)
        if self.active:
            log.warning("stopping with reconciles of %s still running", sorted(self.active))

    def release(self, namespace: str | None) -> None:
        """The caches of ``namespace`` (None: all) are filled: reconcile the jobs that waited."""
        for key in sorted(self.waiting):
            if namespace is None or key[0] == namespace:
                self.waiting.discard(key)
                self.spawn(self.enqueue(key))

    def later(self, key: Key, seconds: float | None) -> None:
        """Reconcile ``key`` again after ``seconds`` even without an event (None: only on one)."""
        if seconds is None:
            self.due.pop(key, None)
        else:
            self.due[key] = time.monotonic() + seconds

    def everything(self) -> None:
        """Reconciles every job now (this replica has just started to lead)."""
        for key in self.jobs():
            self.due.pop(key, None)
            self.spawn(self.enqueue(key))

    def depth(self) -> int:
        """Jobs being reconciled, due for one, or waiting for the caches (a metric)."""
        now = time.monotonic()
        due = {k for k, t in self.due.items() if t <= now}
        return len(self.active | self.again | self.waiting | due)

    async def clock(self, resync_s: float) -> None:
        last_resync = time.monotonic()
        while True:
            await asyncio.sleep(0.5)
            now = time.monotonic()
            if now - last_resync >= resync_s:
                last_resync = now
                keys = self.jobs()
            else:
                keys = [k for k, t in self.due.items() if t <= now]
            for key in keys:
                self.due.pop(key, None)
                self.spawn(self.enqueue(key))
