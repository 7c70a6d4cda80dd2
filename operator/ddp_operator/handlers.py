"""The kopf wiring: start-up, the DDPJob watch and index, shutdown. Everything else is in
:mod:`ddp_operator.controller` (I/O) and :mod:`ddp_operator.planner`/
:mod:`~ddp_operator.bookkeeping` (decisions).

Run it with ``kopf run --standalone -m ddp_operator.handlers --all-namespaces`` (or ``-n NS``).
kopf watches DDPJobs, with an index and a watching handler (``on.event``) only: no timers or
daemons, so kopf puts no finalizer and no annotation on DDPJobs, and a job whose operator is
down is still deleted by the garbage collector. kopf writes nothing at all (its Events are
off; its ClusterRole could not patch a DDPJob), so with several replicas (``--standalone``: no
kopf peering) the Lease of :mod:`ddp_operator.leadership` alone decides which one writes; every
write goes through :class:`ddp_operator.kube.Kube`, which sends none from a standby. The jobs'
pods and Services are watched by :mod:`ddp_operator.informer`; time-driven work (backoff,
deadline, TTL, resync) runs from the controller's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import ctypes
import logging
import os
import socket
import uuid
from typing import Any

import kopf

from ddp_api.contract import GROUP, PLURAL, VERSION

from . import kube
from .actions import COMPONENT
from .controller import Controller
from .leadership import Elector
from .settings import Settings

# The operator's one controller; its settings are read from the environment once, at start-up.
CONTROLLER = Controller()


class NoDiffBase(kopf.DiffBaseStorage):
    """No diffs: this operator has no on.create/on.update handlers, only watches and indices.

    kopf's default builds a deep copy of every object on every event to diff it with the last
    handled state; at hundreds of pods that copying was most of the operator's CPU.
    """

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        pass


def _limit_malloc_arenas() -> None:
    """glibc makes a malloc arena per thread; two keep the resident set small (no-op elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(-8, 2)  # M_ARENA_MAX


# kopf passes every handler all of its keyword arguments (body, namespace, the indices by their
# function names, ...); the handlers below pick what they use from ``kw``.


@kopf.on.login()
def login(**kw: Any) -> kopf.ConnectionInfo | None:
    return kube.login(**kw)


@kopf.on.startup()
async def configure(**kw: Any) -> None:
    settings: kopf.OperatorSettings = kw["settings"]
    settings.peering.standalone = True  # kopf's peering off: our Lease decides who acts
    # No watch of CRDs or namespaces: the ClusterRole grants neither, and none is needed.
    settings.scanning.disabled = True
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.posting.enabled = False  # our own Events say what was decided, by the leader
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    # kopf's "handler succeeded" line for every job event is noise at scale; errors stay.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    _limit_malloc_arenas()
    ours = CONTROLLER.settings = Settings.from_env(os.environ)
    CONTROLLER.actions.instance = os.environ.get("HOSTNAME", COMPONENT)  # its Events' reporter
    CONTROLLER.jobs = kw["jobs_by_name"]
    metrics = CONTROLLER.metrics
    credentials = lambda: kube.login(settings=settings)  # noqa: E731
    me = ours.identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    agent = f"{COMPONENT}/{me}"
    if ours.leader_election:
        CONTROLLER.elector = Elector(
            kube.Kube(credentials, 1, attempts=1, user_agent=agent),  # never queued behind ours
            ours.lease_namespace,
            ours.lease_name,
            me,
            ours.lease,
            CONTROLLER.leading,
        )
        metrics.leader.set(0)
        CONTROLLER.spawn(CONTROLLER.elector.run())
    CONTROLLER.start_watches(
        kube.Kube(
            credentials,
            ours.workers,
            on_error=lambda code: metrics.api_errors.labels(code).inc(),
            may_write=CONTROLLER.acting,
            user_agent=agent,
        )
    )
    CONTROLLER.spawn(CONTROLLER.queue.clock(CONTROLLER.settings.resync_s))
    metrics.watch_jobs(lambda: _indexed_jobs(kw["jobs_by_name"]))
    metrics.track_queue(CONTROLLER.queue.depth)
    metrics.serve(CONTROLLER.settings.metrics_port)


def _indexed_jobs(index: kopf.Index[Any, Any]) -> list[Any]:
    return [job for key in list(index) for job in index.get(key, [])]


@kopf.on.cleanup()
async def shutdown(**_: Any) -> None:
    CONTROLLER.metrics.stop()
    elector, api = CONTROLLER.elector, CONTROLLER.api
    if elector is not None:  # stop writing, let the writes in flight land, give the Lease up
        await elector.release(lambda: api.drained(5.0) if api is not None else asyncio.sleep(0))
        await elector.api.close()
    for task in list(CONTROLLER.tasks):
        task.cancel()
    if CONTROLLER.watches is not None:
        await CONTROLLER.watches.stop()
    if api is not None:
        await api.close()


def _not_deleted(**kw: Any) -> bool:
    return not kw["body"].metadata.get("deletionTimestamp")


# A job being deleted leaves the index: the garbage collector removes its pods and Services.
# async: kopf runs plain functions in a thread pool, a hop per event.
@kopf.index(GROUP, VERSION, PLURAL, when=_not_deleted)
async def jobs_by_name(**kw: Any) -> Any:
    body = kw["body"]
    keys = ("name", "namespace", "uid", "generation", "creationTimestamp", "labels")
    meta = {k: copy.deepcopy(body.metadata.get(k)) for k in keys}
    snapshot = {"spec": body.get("spec") or {}, "status": body.get("status") or {}}
    return {(kw["namespace"], kw["name"]): {"metadata": meta, **copy.deepcopy(snapshot)}}


@kopf.on.event(GROUP, VERSION, PLURAL)
async def on_job_event(**kw: Any) -> None:
    if kw["event"]["type"] == "DELETED":
        CONTROLLER.forget((kw["namespace"], kw["name"]), kw["body"].metadata.get("uid") or "")
        return
    await CONTROLLER.queue.enqueue((kw["namespace"], kw["name"]))
