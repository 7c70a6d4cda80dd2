"""The kopf shell: observe a DDPJob and its pods, ask :mod:`ddp_operator.plan`, apply the answer.

Run it with ``kopf run --standalone -m ddp_operator.handlers --all-namespaces`` (or ``-n NS``).

kopf watches DDPJobs, with an index and a watching handler (``on.event``) only: no timers or
daemons, so kopf puts no finalizer and no annotation on DDPJobs, and a job whose operator is
down is still deleted by the garbage collector. The job's pods and Services are watched by
:mod:`ddp_operator.informer`, which keeps only what the planner reads of them. Time-driven
work (backoff, deadline, TTL) runs from a clock task that re-reconciles a job when its plan asks
to, and resyncs every job every ``DDP_RESYNC_S`` seconds.

Events about a job are coalesced as in Kubernetes' own controllers' work queues: at most one
reconcile of a job runs at a time, and events that arrive meanwhile cause one more, on the
newest state. Idempotence: pod and Service names are deterministic, so a create that repeats
(after a restart) meets AlreadyExists and changes nothing; creates made but not yet seen by the
watch are remembered ("expectations"), and the status this process wrote last is preferred
over a staler one from the watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import ctypes
import datetime as dt
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import kopf
from pydantic import ValidationError

from . import informer, kube, render
from . import plan as planner
from .api import API_VERSION, GROUP, KIND, PLURAL, VERSION, DDPJob

log = logging.getLogger("ddp_operator")

Key = tuple[str, str]
EXPECTATION_TTL_S = 30.0
# Status fields that change with every pod coming up; written at most this often.
COUNT_FIELDS = {"nodes", "readyNodes", "ready", "worldSize"}
STATUS_COUNTS_EVERY_S = 1.0
COMPONENT = "ddp-operator"


def operator_config() -> render.OperatorConfig:
    return render.OperatorConfig(
        default_image=os.environ.get("DDP_DEFAULT_IMAGE", render.OperatorConfig.default_image),
        monitor_interval_s=float(os.environ.get("DDP_MONITOR_INTERVAL_S", "5")),
    )


@dataclass
class Controller:
    """The operator's memory between events; lost on restart, which only costs API calls."""

    cfg: render.OperatorConfig = field(default_factory=operator_config)
    backoff_base_s: float = float(os.environ.get("DDP_BACKOFF_BASE_S", "10"))
    resync_s: float = float(os.environ.get("DDP_RESYNC_S", "30"))
    concurrency: int = int(os.environ.get("DDP_WORKERS", "48"))  # API requests in flight
    active: set[Key] = field(default_factory=set)  # jobs being reconciled now
    again: set[Key] = field(default_factory=set)  # ... that had events meanwhile
    written: dict[str, dict[str, Any]] = field(default_factory=dict)  # job uid -> our status
    status_written_at: dict[str, float] = field(default_factory=dict)  # job uid -> monotonic
    # Pods created but not yet seen by the watch: name -> when created.
    expected: dict[Key, dict[str, float]] = field(default_factory=dict)
    due: dict[Key, float] = field(default_factory=dict)  # monotonic time of the next check
    # ("account" or "role", namespace) -> the create of the trainer's ServiceAccount, Role+binding
    trainer_rbac: dict[tuple[str, str], asyncio.Future[None]] = field(default_factory=dict)
    api: kube.Kube | None = None
    jobs: kopf.Index[Any, Any] | None = None  # kopf's jobs_by_name index
    pods: informer.Cache[planner.PodView] = field(
        default_factory=lambda: informer.Cache(render.LABEL_JOB, planner.view)
    )
    services: informer.Cache[str] = field(
        default_factory=lambda: informer.Cache(render.LABEL_JOB, _name)
    )
    watches: informer.Watches | None = None
    waiting: set[Key] = field(default_factory=set)  # jobs seen before their caches were filled

    def start_watches(self, api: kube.Kube) -> None:
        """Fills the pod and Service caches, then keeps them current; reconciles start after."""
        self.api = api
        caches: dict[str, informer.Cache[Any]] = {"pods": self.pods, "services": self.services}
        self.watches = informer.Watches(api, caches, self.changed, self._release)
        self.watches.start()

    def changed(self, key: Key) -> None:
        _spawn(self.enqueue(key))

    def _release(self, namespace: str | None) -> None:
        """The caches of ``namespace`` (None: all) are filled: reconcile the jobs that waited."""
        for key in sorted(self.waiting):
            if namespace is None or key[0] == namespace:
                self.waiting.discard(key)
                _spawn(self.enqueue(key))

    def forget(self, key: Key, uid: str) -> None:
        """Drops what this process remembers of a deleted job."""
        self.written.pop(uid, None)
        self.status_written_at.pop(uid, None)
        self.expected.pop(key, None)
        self.due.pop(key, None)

    # -- the work queue --------------------------------------------------------------------------
    async def enqueue(self, key: Key) -> None:
        """Reconciles ``key`` now, or once more after the reconcile that is running."""
        if self.watches is None or not self.watches.ready(key[0]):
            self.waiting.add(key)  # planning from empty caches would recreate what exists
            return
        if key in self.active:
            self.again.add(key)
            return
        self.active.add(key)
        try:
            while True:
                self.again.discard(key)
                bodies = list(self.jobs.get(key, [])) if self.jobs is not None else []
                if not bodies:
                    break
                try:
                    await self.reconcile(bodies[0])
                except Exception:
                    log.exception("reconcile of %s/%s failed; retrying in 5s", *key)
                    self.due[key] = time.monotonic() + 5
                if key not in self.again:
                    break
        finally:
            self.active.discard(key)

    async def reconcile(self, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        key: Key = (meta["namespace"], meta["name"])
        observed = self.pods.get(key)
        pods = {v.name for v in observed}  # a Service may have a pod's name (<job>-rdzv)
        services = self.services.names(key)
        now_m = time.monotonic()
        expected = self.expected.setdefault(key, {})
        for name in list(expected):
            if name in pods or now_m - expected[name] > EXPECTATION_TTL_S:
                del expected[name]
        status = _merged(body.get("status") or {}, self.written.get(meta.get("uid", "")))
        job: DDPJob | None = None
        try:
            job = DDPJob.model_validate({"metadata": meta, "spec": body.get("spec") or {}})
            p = planner.plan(
                job,
                status,
                observed,
                dt.datetime.now(dt.UTC),
                self.cfg,
                self.backoff_base_s,
                pending=expected.keys(),
            )
        except ValidationError as e:
            p = _invalid(status, e)
        p.create = [
            o
            for o in p.create
            if o["metadata"]["name"] not in (services if o["kind"] == "Service" else pods)
        ]
        made = await self.apply(body, job, status, p)
        for obj in made:
            if obj["kind"] == "Pod":
                expected[obj["metadata"]["name"]] = time.monotonic()
        if len(made) < len(p.create):
            p.requeue(5.0)  # some creates were refused: try again soon, events or not
        if p.requeue_after is not None:
            self.due[key] = time.monotonic() + p.requeue_after
        else:
            self.due.pop(key, None)

    async def apply(
        self, body: dict[str, Any], job: DDPJob | None, status: dict[str, Any], p: planner.Plan
    ) -> list[dict[str, Any]]:
        """Acts, and writes status. When the plan counted a failure, status goes first, so that
        an operator that dies in between never counts it again; otherwise it goes last, so that
        a new job's pods are not held up by a round trip."""
        assert self.api is not None
        meta = body["metadata"]
        ns, name, uid = meta["namespace"], meta["name"], meta.get("uid", "")
        job_path = kube.group_path(API_VERSION, ns, PLURAL, name)
        diff = {k for k, v in p.status.items() if status.get(k) != v}
        counted = "handledFailures" in diff
        since = time.monotonic() - self.status_written_at.get(uid, -STATUS_COUNTS_EVERY_S)
        if diff and diff <= COUNT_FIELDS and since < STATUS_COUNTS_EVERY_S:
            # Only node counts moved (pods coming up): write them at most once a second.
            p.requeue(STATUS_COUNTS_EVERY_S - since)
            diff = set()
        changed = bool(diff)

        async def write_status() -> bool:
            assert self.api is not None
            r = await self.api.must(
                "PATCH", job_path + "/status", {"status": p.status}, kube.MERGE_PATCH, ok=(404,)
            )
            if r.status == 404:
                return False  # the job is gone; its pods go with it
            self.written[uid] = dict(p.status)
            self.status_written_at[uid] = time.monotonic()
            return True

        if changed and counted and not await write_status():
            return []
        if job is not None and any(o["kind"] == "Pod" for o in p.create):
            await self._ensure_trainer_rbac(job)
        created = await asyncio.gather(*(self._create(obj, body) for obj in p.create))
        await asyncio.gather(
            *(
                self.api.must("DELETE", kube.core_path(ns, "pods", pod), ok=(404,))
                for pod in p.delete
            )
        )
        await asyncio.gather(*(self._event(body, *e) for e in p.events))
        if changed and not counted:
            await write_status()
        if p.delete_job:
            await self.api.must("DELETE", job_path + "?propagationPolicy=Background", ok=(404,))
            self.written.pop(uid, None)
        return [o for o, ok in zip(p.create, created, strict=True) if ok]

    async def _create(self, obj: dict[str, Any], body: dict[str, Any]) -> bool:
        assert self.api is not None
        r = await self.api.call("POST", kube.path_of(obj), obj)
        if r.ok:
            return True
        if r.status != 409:  # 409: already there, idempotent by name
            # Refused (quota, admission, a bad override): say why where the user looks.
            await self._event(
                body,
                "Warning",
                "CreateFailed",
                f"creating {obj['kind']} {obj['metadata']['name']} failed: {r.message}",
            )
        return False

    async def _ensure_trainer_rbac(self, job: DDPJob) -> None:
        """The ServiceAccount that lets rank 0 patch ``status.progress``, and nothing more.

        Made once per namespace and operator process; concurrent reconciles share one attempt,
        and a failed one is tried again by the next reconcile. Only the ServiceAccount is
        awaited (admission refuses a pod whose ServiceAccount does not exist); its Role and
        RoleBinding are needed only once rank 0 reports progress, so they follow meanwhile.
        """
        t = job.spec.template
        ns = render.job_key(job)[0]
        if t is not None and t.service_account_name:
            return
        self._once(("role", ns), lambda: self._make_trainer_role(ns))
        account = render.trainer_service_account(ns)
        await asyncio.shield(self._once(("account", ns), lambda: self._post(account)))

    def _once(self, key: tuple[str, str], make: Any) -> asyncio.Future[None]:
        task = self.trainer_rbac.get(key)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = self.trainer_rbac[key] = asyncio.ensure_future(make())
            task.add_done_callback(_log_failure)
        return task

    async def _post(self, obj: dict[str, Any]) -> None:
        assert self.api is not None
        await self.api.must("POST", kube.path_of(obj), obj, ok=(409,))  # 409: already there

    async def _make_trainer_role(self, ns: str) -> None:
        # RBAC checks a new binding against its Role, so the Role must exist first.
        await self._post(render.trainer_role(ns))
        await self._post(render.trainer_role_binding(ns))

    async def _event(self, body: dict[str, Any], etype: str, reason: str, text: str) -> None:
        assert self.api is not None
        meta = body["metadata"]
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{meta['name']}.{uuid.uuid4().hex[:16]}",
                "namespace": meta["namespace"],
            },
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "type": etype,
            "reason": reason,
            "message": text[:1024],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": os.environ.get("HOSTNAME", COMPONENT),
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        r = await self.api.call("POST", kube.path_of(event), event)
        if not r.ok:  # an Event is worth a log line, never a failed reconcile
            log.warning("could not post event %s on %s: %s", reason, meta["name"], r.message)
        log.info("%s %s/%s: %s", reason, meta["namespace"], meta["name"], text)

    # -- the clock: backoff, deadline and TTL end by time, not by an event ----------------------
    async def clock(self) -> None:
        last_resync = time.monotonic()
        while True:
            await asyncio.sleep(0.5)
            now = time.monotonic()
            if now - last_resync >= self.resync_s:
                last_resync = now
                keys = list(self.jobs or [])
            else:
                keys = [k for k, t in self.due.items() if t <= now]
            for key in keys:
                self.due.pop(key, None)
                _spawn(self.enqueue(key))


def _log_failure(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("creating the trainer's RBAC failed (tried again): %s", task.exception())


def _name(obj: Any) -> str:
    return str(obj["metadata"]["name"])


def _merged(observed: dict[str, Any], ours: dict[str, Any] | None) -> dict[str, Any]:
    """The watched status with our own last write on top (a merge patch: None removes)."""
    out = dict(observed)
    for k, v in (ours or {}).items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def _invalid(status: dict[str, Any], error: ValidationError) -> planner.Plan:
    """A spec the API server accepted but this operator cannot read (say, from a newer CRD)."""
    p = planner.Plan()
    text = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
    if status.get("phase") != "Failed":
        now = planner.ts(dt.datetime.now(dt.UTC))
        p.status = {
            "phase": "Failed",
            "completionTime": now,
            "conditions": planner.conditions(
                status.get("conditions") or [], "Failed", "InvalidSpec", text, now
            ),
        }
        p.warn("InvalidSpec", text)
    return p


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


CONTROLLER = Controller()
_tasks: set[asyncio.Task[None]] = set()


def _spawn(coro: Any) -> None:
    task = asyncio.get_running_loop().create_task(coro)
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


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
    settings.peering.standalone = True  # one replica (Deployment strategy Recreate)
    # No watch of CRDs or namespaces: the ClusterRole grants neither, and none is needed.
    settings.scanning.disabled = True
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.posting.level = logging.WARNING  # our own Events say what was decided
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    # kopf's "handler succeeded" line for every job event is noise at scale; errors stay.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    _limit_malloc_arenas()
    CONTROLLER.jobs = kw["jobs_by_name"]
    CONTROLLER.start_watches(
        kube.Kube(lambda: kube.login(settings=settings), CONTROLLER.concurrency)
    )
    _spawn(CONTROLLER.clock())


@kopf.on.cleanup()
async def shutdown(**_: Any) -> None:
    for task in list(_tasks):
        task.cancel()
    if CONTROLLER.watches is not None:
        await CONTROLLER.watches.stop()
    if CONTROLLER.api is not None:
        await CONTROLLER.api.close()


def _not_deleted(**kw: Any) -> bool:
    return not kw["body"].metadata.get("deletionTimestamp")


# A job being deleted leaves the index: the garbage collector removes its pods and Services.
# async: kopf runs plain functions in a thread pool, a hop per event.
@kopf.index(GROUP, VERSION, PLURAL, when=_not_deleted)
async def jobs_by_name(**kw: Any) -> Any:
    body = kw["body"]
    meta = {k: body.metadata.get(k) for k in ("name", "namespace", "uid", "generation")}
    snapshot = {"spec": body.get("spec") or {}, "status": body.get("status") or {}}
    return {(kw["namespace"], kw["name"]): {"metadata": meta, **copy.deepcopy(snapshot)}}


@kopf.on.event(GROUP, VERSION, PLURAL)
async def on_job_event(**kw: Any) -> None:
    if kw["event"]["type"] == "DELETED":
        CONTROLLER.forget((kw["namespace"], kw["name"]), kw["body"].metadata.get("uid") or "")
        return
    await CONTROLLER.enqueue((kw["namespace"], kw["name"]))
