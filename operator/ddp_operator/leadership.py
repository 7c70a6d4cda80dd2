"""Leader election: of the operator's replicas, the one that holds a ``coordination.k8s.io``
Lease acts; the others keep their caches warm and take the Lease over when it is not renewed.

The decisions are pure: :func:`decide` (what to do with the Lease as read) and :func:`acting`
(whether this replica may write now, on its own monotonic clock); :class:`Elector` is the I/O
around them: a GET, PUT or POST of the Lease every ``retry_s``, each write conditional on the
resourceVersion read (a 409 means another replica wrote it first).

Why two writers cannot act at once (docs/design.md, "The operator's own failures"): a leader
acts only until ``renew_deadline_s`` after it *sent* its last successful renewal; a candidate
takes the Lease only after it has seen the same version of it, unchanged, for the
``leaseDurationSeconds`` the holder wrote into it (longer), counted from when the candidate
first read that version, which was after the holder sent it. Only clock *rates* are compared,
never two machines' times.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import enum
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import kube

log = logging.getLogger("ddp_operator")

API_VERSION = "coordination.k8s.io/v1"
# This machine's clock for every duration here: monotonic, and on Linux counting a suspend too
# (CLOCK_BOOTTIME; CLOCK_MONOTONIC stops while the machine sleeps, and a leader woken from a
# suspend would think that no time had passed).
_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def clock() -> float:
    return time.clock_gettime(_CLOCK)


MICRO_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"  # a Lease's acquireTime and renewTime (metav1.MicroTime)


@dataclass(frozen=True)
class Durations:
    """As controller-runtime's defaults: a leader that cannot renew stops acting 5 s before
    another replica may take over; a lost leader is replaced within 15 s and a reconcile."""

    lease_s: float = 15.0  # a candidate waits this long after the Lease last changed
    renew_deadline_s: float = 10.0  # a leader acts this long after its last renewal was sent
    retry_s: float = 2.0  # every replica reads or renews the Lease this often

    def problems(self) -> list[str]:
        """What makes these durations unsafe or useless (empty when they are fine)."""
        out = []
        if not 0 < self.renew_deadline_s < self.lease_s:
            out.append("the renew deadline must be positive and shorter than the lease")
        if not 0 < self.retry_s < self.renew_deadline_s:
            out.append("the retry period must be positive and shorter than the renew deadline")
        return out


@dataclass(frozen=True)
class Held:
    """The Lease as read: its holder ("" when released), the lease it promised, its version."""

    holder: str
    lease_s: float
    version: str  # metadata.resourceVersion: changes with every write

    @classmethod
    def of(cls, lease: Mapping[str, Any], default_lease_s: float) -> Held:
        spec = lease.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            lease_s=float(spec.get("leaseDurationSeconds") or default_lease_s),
            version=str((lease.get("metadata") or {}).get("resourceVersion") or ""),
        )


@dataclass(frozen=True)
class Seen:
    """A version of the Lease and when this replica first read it (its monotonic clock)."""

    version: str
    at: float


class Move(enum.Enum):
    CREATE = "create"  # no Lease yet: create it, held by us
    TAKE = "take"  # released, or not renewed for its lease: write ourselves in
    RENEW = "renew"  # ours already: renew it
    WAIT = "wait"  # another replica's, and live (or just seen changed): stand by


def seen(lease: Held | None, before: Seen | None, now: float) -> Seen | None:
    """This replica's memory of the Lease after reading ``lease`` at ``now``: the clock of a
    version starts when that version is first read, and only then."""
    if lease is None:
        return None
    if before is not None and before.version == lease.version:
        return before
    return Seen(lease.version, now)


def decide(lease: Held | None, me: str, memory: Seen | None, now: float) -> Move:
    """What replica ``me`` does with ``lease`` as just read; ``memory`` is :func:`seen` of it."""
    if lease is None:
        return Move.CREATE
    if lease.holder == me:  # identities are unique per process: it is ours, whatever we forgot
        return Move.RENEW
    if not lease.holder:  # released by a leader that stopped acting first
        return Move.TAKE
    if memory is not None and memory.version == lease.version and now - memory.at >= lease.lease_s:
        return Move.TAKE
    return Move.WAIT


def acting(now: float, renewed_at: float | None, renew_deadline_s: float) -> bool:
    """Whether a replica may write at ``now``: it holds the Lease by a write of its own sent at
    ``renewed_at`` (None: it does not), less than ``renew_deadline_s`` ago."""
    return renewed_at is not None and now < renewed_at + renew_deadline_s


def lease_body(
    name: str,
    namespace: str,
    holder: str,
    durations: Durations,
    now: dt.datetime,
    previous: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The Lease to write: ``previous`` (as read; its resourceVersion makes the write
    conditional) with ``holder`` renewing, taking or ("" ) releasing it."""
    old = dict((previous or {}).get("spec") or {})
    stamp = now.astimezone(dt.UTC).strftime(MICRO_TIME)
    spec: dict[str, Any] = {
        **old,
        "holderIdentity": holder or None,
        # Whole seconds, rounded up: a candidate may wait longer than promised, never shorter.
        "leaseDurationSeconds": max(1, math.ceil(durations.lease_s)) if holder else 1,
        "renewTime": stamp,
    }
    if old.get("holderIdentity") != holder:
        spec["acquireTime"] = stamp if holder else None
        if holder and old.get("holderIdentity"):
            spec["leaseTransitions"] = int(old.get("leaseTransitions") or 0) + 1
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    version = ((previous or {}).get("metadata") or {}).get("resourceVersion")
    if version:
        meta["resourceVersion"] = version
    return {
        "apiVersion": API_VERSION,
        "kind": "Lease",
        "metadata": meta,
        "spec": {k: v for k, v in spec.items() if v is not None},
    }


class Elector:
    """Holds or waits for the Lease ``namespace/name`` as ``me``; ``changed(True)`` when this
    replica starts acting, ``changed(False)`` when it stops (once each).

    ``api`` is this part's own session, one request at a time and no retries inside a request:
    a renewal must not queue behind the controller's requests, and a failed one is simply
    tried again ``retry_s`` later, until the renew deadline closes the gate by itself.
    """

    def __init__(
        self,
        api: kube.Kube,
        namespace: str,
        name: str,
        me: str,
        durations: Durations,
        changed: Callable[[bool], None],
    ):
        self.api, self.namespace, self.name, self.me = api, namespace, name, me
        self.durations, self.changed = durations, changed
        self.path = kube.group_path(API_VERSION, namespace, "leases", name)
        self.renewed_at: float | None = None  # when our last successful write as holder was sent
        self.mine: dict[str, Any] | None = None  # the Lease as we last wrote it, while we hold it
        self.memory: Seen | None = None
        self.holder = ""  # as last read or written
        self.leading = False  # as last announced
        self.stopped = False
        self.task: asyncio.Task[Any] | None = None  # run()'s

    def acting(self) -> bool:
        """The gate of every write the operator sends (:class:`~ddp_operator.kube.Kube`)."""
        return not self.stopped and acting(
            clock(), self.renewed_at, self.durations.renew_deadline_s
        )

    async def run(self) -> None:
        """Every ``retry_s``: renew the Lease, or read it and take it when it is due."""
        self.task = asyncio.current_task()
        while True:
            started = clock()
            try:
                await asyncio.wait_for(self.step(), self.durations.renew_deadline_s / 2)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the API server is away: the gate closes by itself
                log.warning("leader election: Lease %s/%s: %r", self.namespace, self.name, e)
            self.announce()
            await asyncio.sleep(max(0.0, self.durations.retry_s - (clock() - started)))

    async def step(self) -> None:
        if self.stopped:
            return
        if self.mine is not None:
            sent = clock()
            body = lease_body(self.name, self.namespace, self.me, self.durations, _now(), self.mine)
            r = await self.api.call("PUT", self.path, body)
            if r.ok:
                self._hold(r.body, sent)
                return
            if r.status not in (404, 409):
                return  # not refused, not renewed: tried again next time
            self._drop()  # another replica wrote it: stop at once, then see who holds it
        r = await self.api.call("GET", self.path)
        if r.status == 404:
            lease: Held | None = None
        elif r.ok:
            lease = Held.of(r.body, self.durations.lease_s)
            self.holder = lease.holder
        else:
            raise kube.KubeError("GET", self.path, r)
        now = clock()
        self.memory = seen(lease, self.memory, now)
        move = decide(lease, self.me, self.memory, now)
        if move is Move.WAIT:
            return
        sent = clock()
        if move is Move.CREATE:
            method, path = "POST", kube.group_path(API_VERSION, self.namespace, "leases")
            body = lease_body(self.name, self.namespace, self.me, self.durations, _now())
        else:  # conditional on the version read: a 409 if another replica wrote since
            method, path = "PUT", self.path
            body = lease_body(self.name, self.namespace, self.me, self.durations, _now(), r.body)
        r = await self.api.call(method, path, body)
        if r.ok:
            if lease is not None and lease.holder not in ("", self.me):
                log.info("Lease %s/%s not renewed by %s for %gs: taking it",
                         self.namespace, self.name, lease.holder, lease.lease_s)  # fmt: skip
            self._hold(r.body, sent)
        elif r.status not in (404, 409):  # 409: another replica was first
            raise kube.KubeError(method, path, r)

    def announce(self) -> None:
        """Tells ``changed`` (and the log) when acting began or ended since the last call."""
        now = self.acting()
        if now == self.leading:
            return
        self.leading = now
        if now:
            log.info("leading: %s holds Lease %s/%s", self.me, self.namespace, self.name)
        elif self.stopped:
            log.info("stopped acting: shutting down")
        elif self.mine is not None and self.renewed_at is not None:
            log.warning(
                "stopped acting: Lease %s/%s not renewed for %.1fs (the renew deadline)",
                self.namespace, self.name, clock() - self.renewed_at,
            )  # fmt: skip
        else:
            log.warning(
                "stopped acting: Lease %s/%s is held by %r", self.namespace, self.name, self.holder
            )
        self.changed(now)

    async def release(self, drained: Callable[[], Awaitable[None]]) -> None:
        """Stops acting, waits for ``drained()`` (the writes in flight), then gives the Lease up
        so that a standby takes over at its next read instead of after the whole lease."""
        self.stopped = True
        self.announce()
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await drained()
        try:
            await asyncio.wait_for(self._give_up(), self.durations.retry_s)
        except Exception as e:  # it expires by itself
            log.warning("could not release Lease %s/%s: %r", self.namespace, self.name, e)

    async def _give_up(self) -> None:
        lease = self.mine
        for _ in range(2):
            if lease is None:
                return
            body = lease_body(self.name, self.namespace, "", self.durations, _now(), lease)
            r = await self.api.call("PUT", self.path, body)
            if r.ok:
                log.info("released Lease %s/%s", self.namespace, self.name)
                return
            # A renewal cancelled on its way may have landed: read it again, release it if ours.
            r = await self.api.call("GET", self.path)
            ours = r.ok and Held.of(r.body, self.durations.lease_s).holder == self.me
            lease = r.body if ours else None

    def _hold(self, lease: dict[str, Any], sent: float) -> None:
        self.mine, self.renewed_at, self.holder = lease, sent, self.me
        self.memory = Seen(str((lease.get("metadata") or {}).get("resourceVersion") or ""), sent)

    def _drop(self) -> None:
        self.mine, self.renewed_at = None, None


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
