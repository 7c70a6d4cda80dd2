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
from .settings import Settings

# At a graceful stop, the most it waits for the reconciles in flight, and then for their writes:
# with the Lease's release, well within the pod's 30 s terminationGracePeriodSeconds.
DRAIN_S = 5.0


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
    # Nor a line per kubelet probe of /healthz (two every 10 s: most of a quiet day's log).
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    _limit_malloc_arenas()
    ours = Settings.from_env(os.environ)  # read once, at start-up
    # The operator's one controller, which every handler finds in kopf's memo.
    controller = kw["memo"].controller = Controller(
        ours,
        lambda: kube.login(settings=settings),
        kw["jobs_by_name"],
        ours.identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}",
        instance=os.environ.get("HOSTNAME", COMPONENT),  # its Events' reporter
    )
    controller.start()
    metrics = controller.metrics
    metrics.watch_jobs(lambda: _indexed_jobs(kw["jobs_by_name"]))
    metrics.track_queue(controller.queue.depth)
    metrics.serve(ours.metrics_port)


def _indexed_jobs(index: kopf.Index[Any, Any]) -> list[Any]:
    return [job for key in list(index) for job in index.get(key, [])]


@kopf.on.cleanup()
async def shutdown(**kw: Any) -> None:
    controller: Controller | None = getattr(kw["memo"], "controller", None)
    if controller is None:  # start-up did not get that far
        return
    controller.metrics.stop()
    elector, api = controller.elector, controller.api
    # Let the reconciles in flight end, starting none: each writes its status, pods and Events
    # whole, while this replica still holds the Lease (the gate would refuse the rest).
    await controller.queue.drain(DRAIN_S)
    if elector is not None:  # stop writing, let the writes in flight land, give the Lease up
        await elector.release(lambda: api.drained(DRAIN_S))
        await elector.api.close()
    for task in list(controller.tasks):
        task.cancel()
    await controller.watches.stop()
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
    controller: Controller = kw["memo"].controller
    if kw["event"]["type"] == "DELETED":
        controller.forget((kw["namespace"], kw["name"]), kw["body"].metadata.get("uid") or "")
        return
    await controller.queue.enqueue((kw["namespace"], kw["name"]))
