"""The machines as the controller sees them: each Node's readiness (a Node informer) and each
kubelet's heartbeat (its Lease in ``kube-node-lease``, renewed every 10 s), so that a machine
that went silent is known lost before its Node says so (kube-controller-manager waits 50 s).

The decisions are pure (:func:`~ddp_operator.planner.lost_machines.silent_machines`,
:func:`~ddp_operator.planner.lost_machines.stalled`); this part keeps the
caches and the clock, and tells the controller which machine changed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from ddp_api.contract import rfc3339

from . import informer, kube
from .planner import lost_machines
from .planner.views import MachineView, machine_view

log = logging.getLogger("ddp_operator")

Key = tuple[str, str]
LEASE_NAMESPACE = "kube-node-lease"  # where each kubelet renews the Lease named after its Node
PROBE_TIMEOUT_S = 2.0  # each tick's /readyz: a server that answers slower is not heard


@dataclass
class Machines:
    """Nodes and their heartbeats; ``changed`` gets ("", machine) when one that the planner
    reads changed (readiness, what may be placed there, or silence begun or ended)."""

    grace_s: float
    changed: Callable[[Key], None]
    nodes: informer.ByName[MachineView] = field(
        default_factory=lambda: informer.ByName(machine_view)
    )
    leases: informer.ByName[str] = field(default_factory=lambda: informer.ByName(_renewed))
    # Machine -> when its Lease was last seen renewed (our monotonic clock, our wall clock).
    heard: dict[str, tuple[float, dt.datetime]] = field(default_factory=dict)
    # Machines this part declared silent -> when last heard (RFC 3339). Kept, not derived from
    # ``heard`` at read time: only the watch loop knows whether this process was itself stopped
    # (then every machine is heard afresh, not lost), and a reconcile right after a thaw must
    # not see them all silent.
    silent: dict[str, str] = field(default_factory=dict)
    # Machines back -> since when (RFC 3339, our clock), for planner.placement: heard again
    # after this part declared them silent (a machine back before its Node turned Unknown shows
    # it nowhere else), or uncordoned (a Node keeps no time of that).
    back: dict[str, str] = field(default_factory=dict)
    cordoned: set[str] = field(default_factory=set)  # Nodes seen with spec.unschedulable
    # Whether this part can hear the kubelets: the API server ready and the Lease watch
    # following (asked each tick of the silence watch; None: not asked, as in tests without a
    # server); since when it could not, on our monotonic clock.
    hearing: Callable[[], Awaitable[bool]] | None = None
    deaf_since: float | None = None

    def start(self, api: kube.Kube, spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        nodes = informer.Informer(api, "nodes", None, self.nodes, self._node)
        spawn(_keep(nodes))
        leases = informer.Informer(api, "leases", LEASE_NAMESPACE, self.leases, self._heartbeat,
                                   api_version="coordination.k8s.io/v1")  # fmt: skip
        spawn(_keep(leases))

        async def hearing() -> bool:
            # A Lease watch that failed (and retries after a backoff) hears no renewal either;
            # one RBAC forbids (a namespaced install) never runs, and no machine is heard.
            following = leases.following or leases.forbidden
            return await api.ready(PROBE_TIMEOUT_S) and following

        self.hearing = hearing
        spawn(self.watch_silence())

    def views(self) -> dict[str, MachineView]:
        """The Nodes as the planner sees them, the silent ones marked since their last Lease,
        those back (heard again, uncordoned) marked since when."""
        return {
            n: dataclasses.replace(
                v, silent_since=self.silent.get(n, ""), back_since=self.back.get(n, "")
            )
            for n, v in self.nodes.by_name.items()
        }

    def _node(self, key: Key) -> None:
        """A Node changed, joined or went: one uncordoned is back from now."""
        name = key[1]
        view = self.nodes.by_name.get(name)
        if view is None:
            self.cordoned.discard(name)
            self.back.pop(name, None)
        elif view.unschedulable:
            self.cordoned.add(name)
        elif name in self.cordoned:
            self.cordoned.discard(name)
            log.info("machine %s is uncordoned", name)
            self.back[name] = rfc3339(dt.datetime.now(dt.UTC))
        self.changed(key)

    def _heartbeat(self, key: Key) -> None:
        """A machine's Lease was renewed (or is gone): it is heard, silent no more."""
        name = key[1]
        if name in self.leases.by_name:
            self.heard[name] = (time.monotonic(), dt.datetime.now(dt.UTC))
        else:
            self.heard.pop(name, None)
            self.back.pop(name, None)
        if self.silent.pop(name, None) is not None:
            log.info("machine %s is heard again", name)
            if name in self.heard:
                self.back[name] = rfc3339(self.heard[name][1])
            self.changed(key)

    async def watch_silence(self) -> None:
        """Marks a machine silent once its heartbeat has been missing for the grace period;
        the jobs with pods on it are reconciled then (``plan`` deletes those pods).

        Silence is what this process did not hear: when it was itself stopped (its machine
        frozen, then back: a tick comes :data:`~ddp_operator.planner.lost_machines.STALLED_S`
        late), every machine is heard afresh instead, or it would take them all for lost. So
        too when the API server was not ready, or the Lease watch not following, for
        :data:`~ddp_operator.planner.lost_machines.DEAF_S` (no kubelet could renew its Lease
        meanwhile, or none was seen): no machine is taken for silent until both are again, and
        then every machine is heard afresh, as kube-controller-manager does not count a
        heartbeat it could not have seen."""
        tick_s = min(2.0, self.grace_s / 4 or 2.0)
        last = answered = time.monotonic()
        while True:
            ready = True if self.hearing is None else await self.hearing()
            now = time.monotonic()
            if ready:
                answered = now
            if lost_machines.deaf(answered, now):
                if self.deaf_since is None:
                    self.deaf_since = answered
                    log.warning("the API server has not been ready, or the Lease watch not"
                                " following, for %.0fs: no machine is taken for silent until"
                                " both are", now - answered)  # fmt: skip
            else:
                afresh = ""
                if lost_machines.stalled(last, now, tick_s):
                    afresh = f"this operator was stopped for {now - last - tick_s:.0f}s"
                if self.deaf_since is not None:
                    afresh = f"the Lease watch could not hear for {now - self.deaf_since:.0f}s"
                    self.deaf_since = None
                self._mark_silent(now, afresh)
            last = now
            await asyncio.sleep(tick_s)

    def _mark_silent(self, now: float, afresh: str) -> None:
        """One tick's marks: every machine heard afresh first when ``afresh`` says why, then
        each machine silent past the grace marked (once) and its jobs told."""
        if afresh:
            log.warning("%s: every machine heard afresh", afresh)
            wall = dt.datetime.now(dt.UTC)
            self.heard = {name: (now, wall) for name in self.heard}
        heard = {name: mono for name, (mono, _) in self.heard.items()}
        for name in lost_machines.silent_machines(heard, now, self.grace_s) - set(self.silent):
            self.silent[name] = rfc3339(self.heard[name][1])
            log.warning("machine %s: no heartbeat (Lease renewal) for %.0fs", name,
                        self.grace_s)  # fmt: skip
            self.changed(("", name))


async def _keep(w: informer.Informer[Any]) -> None:
    """Keeps the Nodes (or their Leases') cache; without RBAC for it (a namespaced install)
    lost machines are left to Kubernetes' own eviction of their pods."""
    try:
        await w.run(stop_if_forbidden=True)
    except informer.Forbidden as e:
        log.info("%s; pods on lost machines go when Kubernetes evicts them", e)


def _renewed(lease: Any) -> str:
    """A kubelet's Lease, as its heartbeat: the renewTime (changes every renewal)."""
    return str((lease.get("spec") or {}).get("renewTime") or "")
