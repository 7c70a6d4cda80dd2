"""The kopf shell: observe a DDPJob and its pods, ask :mod:`ddp_operator.plan`, apply the answer.

Run it with ``kopf run --standalone -m ddp_operator.handlers --all-namespaces`` (or ``-n NS``).

Only watching handlers (``on.event``) and indices are used: no timers or daemons, so kopf puts
no finalizer and no annotation on DDPJobs, and a job whose operator is down is still deleted
by the garbage collector. Time-driven work (backoff, deadline, TTL) runs from a clock task that
re-reconciles a job when its plan asks to and resyncs every job every ``DDP_RESYNC_S`` seconds.

Idempotence: pod and Service names are deterministic, so a create that repeats (after a restart,
or racing another reconcile) meets AlreadyExists and changes nothing. Creates already made but
not yet seen by the watch are remembered ("expectations", as in Kubernetes' own controllers),
and the status this process wrote last is preferred over a staler one from the watch.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import json
import logging
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from . import plan as planner
from . import render
from .api import GROUP, PLURAL, VERSION, DDPJob

log = logging.getLogger("ddp_operator")

Key = tuple[str, str]
EXPECTATION_TTL_S = 30.0
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
    workers: int = int(os.environ.get("DDP_WORKERS", "16"))
    locks: dict[Key, asyncio.Lock] = field(default_factory=dict)
    written: dict[str, dict[str, Any]] = field(default_factory=dict)  # job uid -> our status
    expected: dict[Key, dict[str, float]] = field(default_factory=dict)  # name -> created at
    due: dict[Key, float] = field(default_factory=dict)  # monotonic time of the next check
    trainer_rbac: set[str] = field(default_factory=set)  # namespaces that have it
    executor: ThreadPoolExecutor | None = None
    api: client.ApiClient | None = None

    def start(self) -> None:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        conf = client.Configuration.get_default_copy()
        conf.connection_pool_maxsize = self.workers
        self.api = client.ApiClient(conf)
        self.executor = ThreadPoolExecutor(self.workers, thread_name_prefix="ddp-apply")

    # -- reconcile: snapshot on the event loop, decide, do the I/O in a thread -------------------
    async def reconcile(self, body: dict[str, Any], pods: kopf.Index, services: kopf.Index) -> None:
        meta = body["metadata"]
        key: Key = (meta["namespace"], meta["name"])
        lock = self.locks.setdefault(key, asyncio.Lock())
        async with lock:
            observed = list(pods.get(key, []))
            existing = {v.name for v in observed} | set(services.get(key, []))
            now_m = time.monotonic()
            expected = self.expected.setdefault(key, {})
            for name in list(expected):
                if name in existing or now_m - expected[name] > EXPECTATION_TTL_S:
                    del expected[name]
            status = _merged(body.get("status") or {}, self.written.get(meta.get("uid", "")))
            job: DDPJob | None = None
            try:
                job = DDPJob.model_validate({"metadata": meta, "spec": body.get("spec") or {}})
                p = planner.plan(
                    job, status, observed, dt.datetime.now(dt.UTC), self.cfg, self.backoff_base_s
                )
            except ValidationError as e:
                p = _invalid(status, e)
            p.create = [
                o
                for o in p.create
                if o["metadata"]["name"] not in existing and o["metadata"]["name"] not in expected
            ]
            loop = asyncio.get_running_loop()
            created = await loop.run_in_executor(self.executor, self.apply, body, job, status, p)
            for name in created:
                expected[name] = time.monotonic()
            if p.requeue_after is not None:
                self.due[key] = time.monotonic() + p.requeue_after
            else:
                self.due.pop(key, None)

    def apply(
        self, body: dict[str, Any], job: DDPJob | None, status: dict[str, Any], p: planner.Plan
    ) -> list[str]:
        """Writes status first (so a counted failure is never counted again), then acts."""
        meta = body["metadata"]
        ns, name, uid = meta["namespace"], meta["name"], meta.get("uid", "")
        core = client.CoreV1Api(self.api)
        custom = client.CustomObjectsApi(self.api)
        if any(status.get(k) != v for k, v in p.status.items()):
            try:
                custom.patch_namespaced_custom_object_status(
                    GROUP,
                    VERSION,
                    ns,
                    PLURAL,
                    name,
                    {"status": p.status},
                    _content_type="application/merge-patch+json",
                )
            except ApiException as e:
                if e.status == 404:
                    return []  # the job is gone; its pods go with it
                raise
            self.written[uid] = dict(p.status)
        created: list[str] = []
        if job is not None and any(o["kind"] == "Pod" for o in p.create):
            self._ensure_trainer_rbac(job)
        for obj in p.create:
            if self._create(core, ns, obj, body):
                created.append(obj["metadata"]["name"])
        for pod in p.delete:
            try:
                core.delete_namespaced_pod(pod, ns)
            except ApiException as e:
                if e.status != 404:
                    raise
        for etype, reason, text in p.events:
            self._event(core, body, etype, reason, text)
        if p.delete_job:
            try:
                custom.delete_namespaced_custom_object(
                    GROUP, VERSION, ns, PLURAL, name, propagation_policy="Background"
                )
            except ApiException as e:
                if e.status != 404:
                    raise
            self.written.pop(uid, None)
        return created

    def _create(
        self, core: client.CoreV1Api, ns: str, obj: dict[str, Any], body: dict[str, Any]
    ) -> bool:
        try:
            if obj["kind"] == "Service":
                core.create_namespaced_service(ns, _untyped(obj))
            else:
                core.create_namespaced_pod(ns, _untyped(obj))
            return True
        except ApiException as e:
            if e.status == 409:  # already there: idempotent by name
                return False
            why = _reason(e)
        except ValueError as e:  # the client's own check of the body
            why = str(e)
        # Refused (quota, admission, a bad override): say why where the user looks.
        self._event(
            core,
            body,
            "Warning",
            "CreateFailed",
            f"creating {obj['kind']} {obj['metadata']['name']} failed: {why}",
        )
        return False

    def _ensure_trainer_rbac(self, job: DDPJob) -> None:
        """The ServiceAccount that lets rank 0 patch ``status.progress``, and nothing more."""
        t = job.spec.template
        ns = render.job_key(job)[0]
        if (t is not None and t.service_account_name) or ns in self.trainer_rbac:
            return
        core, rbac = client.CoreV1Api(self.api), client.RbacAuthorizationV1Api(self.api)
        for create, obj in (
            (core.create_namespaced_service_account, render.trainer_service_account(ns)),
            (rbac.create_namespaced_role, render.trainer_role(ns)),
            (rbac.create_namespaced_role_binding, render.trainer_role_binding(ns)),
        ):
            try:
                create(ns, _untyped(obj))
            except ApiException as e:
                if e.status != 409:
                    raise
        self.trainer_rbac.add(ns)

    def _event(
        self, core: client.CoreV1Api, body: dict[str, Any], etype: str, reason: str, text: str
    ) -> None:
        meta = body["metadata"]
        now = dt.datetime.now(dt.UTC)
        event = {
            "metadata": {
                "name": f"{meta['name']}.{uuid.uuid4().hex[:16]}",
                "namespace": meta["namespace"],
            },
            "involvedObject": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "DDPJob",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
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
        try:
            core.create_namespaced_event(meta["namespace"], _untyped(event))
        except ApiException as e:  # an Event is worth a log line, never a failed reconcile
            log.warning("could not post event %s on %s: %s", reason, meta["name"], _reason(e))
        log.info("%s %s/%s: %s", reason, meta["namespace"], meta["name"], text)

    # -- the clock: backoff, deadline and TTL end by time, not by an event ----------------------
    async def clock(self, jobs: kopf.Index, pods: kopf.Index, services: kopf.Index) -> None:
        last_resync = time.monotonic()
        while True:
            await asyncio.sleep(0.5)
            now = time.monotonic()
            resync = now - last_resync >= self.resync_s
            if resync:
                last_resync = now
            keys = list(jobs) if resync else [k for k, t in self.due.items() if t <= now]
            for key in keys:
                self.due.pop(key, None)
                for body in list(jobs.get(key, [])):
                    task = asyncio.create_task(self._guarded(body, pods, services))
                    _tasks.add(task)
                    task.add_done_callback(_tasks.discard)

    async def _guarded(self, body: dict[str, Any], pods: kopf.Index, services: kopf.Index) -> None:
        try:
            await self.reconcile(body, pods, services)
        except Exception:
            log.exception("reconcile of %s failed", body["metadata"].get("name"))


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


def _untyped(obj: dict[str, Any]) -> Any:
    """The client takes plain dicts as bodies, though its annotations name model classes."""
    return obj


def _reason(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "{}").get("message") or e.reason)
    except ValueError:
        return str(e.reason)


CONTROLLER = Controller()
_tasks: set[asyncio.Task[None]] = set()

# kopf passes every handler all of its keyword arguments (body, namespace, the indices by their
# function names, ...); the handlers below pick what they use from ``kw``.


@kopf.on.startup()
async def configure(**kw: Any) -> None:
    settings: kopf.OperatorSettings = kw["settings"]
    settings.peering.standalone = True  # one replica (Deployment strategy Recreate)
    # No watch of CRDs or namespaces: the ClusterRole grants neither, and none is needed.
    settings.scanning.disabled = True
    # kopf's "handler succeeded" line for every pod event is noise at scale; errors stay.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    settings.posting.level = logging.WARNING  # our own Events say what was decided
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.batching.worker_limit = CONTROLLER.workers * 4
    CONTROLLER.start()
    task = asyncio.get_running_loop().create_task(
        CONTROLLER.clock(kw["jobs_by_name"], kw["pods_by_job"], kw["services_by_job"])
    )
    _tasks.add(task)


@kopf.on.cleanup()
async def shutdown(**_: Any) -> None:
    for task in _tasks:
        task.cancel()
    if CONTROLLER.executor is not None:
        CONTROLLER.executor.shutdown(wait=False, cancel_futures=True)


@kopf.index("pods", labels={render.LABEL_JOB: kopf.PRESENT})
def pods_by_job(**kw: Any) -> Any:
    return {(kw["namespace"], kw["labels"][render.LABEL_JOB]): planner.view(kw["body"])}


@kopf.index("services", labels={render.LABEL_JOB: kopf.PRESENT})
def services_by_job(**kw: Any) -> Any:
    return {(kw["namespace"], kw["labels"][render.LABEL_JOB]): kw["name"]}


@kopf.index(GROUP, VERSION, PLURAL)
def jobs_by_name(**kw: Any) -> Any:
    return {(kw["namespace"], kw["name"]): _plain(kw["body"])}


@kopf.on.event(GROUP, VERSION, PLURAL)
async def on_job_event(**kw: Any) -> None:
    body: kopf.Body = kw["body"]
    if kw["event"]["type"] == "DELETED" or body.metadata.get("deletionTimestamp"):
        CONTROLLER.written.pop(body.metadata.get("uid") or "", None)
        return  # the garbage collector deletes the owned pods and Services
    await CONTROLLER.reconcile(_plain(body), kw["pods_by_job"], kw["services_by_job"])


@kopf.on.event("pods", labels={render.LABEL_JOB: kopf.PRESENT})
async def on_pod_event(**kw: Any) -> None:
    key = (kw["namespace"], kw["labels"][render.LABEL_JOB])
    for job in list(kw["jobs_by_name"].get(key, [])):
        await CONTROLLER.reconcile(job, kw["pods_by_job"], kw["services_by_job"])


def _plain(body: kopf.Body) -> dict[str, Any]:
    """A plain, detached copy of a kopf Body (whose views follow later events)."""
    return copy.deepcopy(dict(body))
