"""List-and-watch caches of the operator's own pods, Services and progress ConfigMaps, kept
outside kopf.

kopf handles every watch event of every object with its full machinery (memories, handler
selection, patch bookkeeping, logging contexts); at hundreds of pods coming up at once that was
most of the operator's CPU, taken from the API server on a small control plane. The planner
reads a handful of fields of each pod, so these caches keep only those (a
:class:`~ddp_operator.planner.views.PodView`) and tell the controller which job's observation
changed.

Like client-go's informers: one LIST (paged), then a WATCH from its resourceVersion with
bookmarks, resumed from the last resourceVersion seen when the server ends it, and a new LIST
when the server answers that the version is too old (410 Gone). After each LIST, every job whose
objects differ from the cache is reported, so nothing that happened during a gap is missed.

The cluster's Nodes ("machines", so as not to confuse them with a job's nodes) are kept the
same way by :class:`ByName`, all of them, for the planner's decision on lost machines.

Scope: the caches are filled cluster-wide when RBAC allows it (a ClusterRoleBinding). When the
cluster-wide LIST is forbidden (a Helm release with ``watchNamespaces``: RoleBindings only),
:class:`Watches` watches each namespace in which a DDPJob is seen instead; kopf itself only
delivers the jobs of the namespaces it was told to watch.

:class:`Cache` is pure (no I/O) and tested on its own; :class:`Informer` is the I/O around it.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from . import kube

log = logging.getLogger("ddp_operator")

T = TypeVar("T")
Key = tuple[str, str]  # (namespace, job name)
Ref = tuple[str, str]  # (namespace, object name)
PAGE = 500
WATCH_S = 300  # the server ends each watch after this long; it is then resumed
RETRY_CAP_S = 30.0


class Expired(Exception):
    """The watch's resourceVersion is no longer served (410 Gone): list again."""


@dataclass
class Cache(Generic[T]):
    """What is kept of each object (``extract`` of its body), grouped by its job: the value of
    its ``label`` (which also selects what is watched), or what ``job_name`` says of it."""

    label: str
    extract: Callable[[Mapping[str, Any]], T]
    job_name: Callable[[Mapping[str, Any]], str | None] | None = None
    by_job: dict[Key, dict[str, T]] = field(default_factory=dict)
    job_of: dict[Ref, Key] = field(default_factory=dict)
    # Told what is kept of each object that leaves the cache (deleted, no longer ours, or gone
    # at a relist), as it was last: for what must outlive the object (a departed pod's record).
    removed: Callable[[Key, T], None] | None = None

    def get(self, key: Key) -> list[T]:
        return list(self.by_job.get(key, {}).values())

    def kept(self, key: Key) -> dict[str, T]:
        """What is kept of each object of the job, by name."""
        return dict(self.by_job.get(key, {}))

    def in_namespace(self, namespace: str) -> list[T]:
        """Everything kept of ``namespace`` (a scan of the whole cache: for rare questions)."""
        return [v for k, kept in self.by_job.items() if k[0] == namespace for v in kept.values()]

    def __len__(self) -> int:
        return len(self.job_of)

    def apply(self, event_type: str, obj: Mapping[str, Any]) -> set[Key]:
        """One watch event (ADDED, MODIFIED, DELETED) -> the jobs whose view of it changed."""
        meta = obj.get("metadata") or {}
        ref: Ref = (meta.get("namespace", ""), meta.get("name", ""))
        job = (meta.get("labels") or {}).get(self.label)
        if job is not None and self.job_name is not None:
            job = self.job_name(obj)
        if event_type == "DELETED" or job is None:  # gone, or no longer ours
            gone = self._remove(ref)
            if gone and self.removed is not None:
                self.removed(next(iter(gone)), self.extract(obj))
            return gone
        key: Key = (ref[0], job)
        changed = self._remove(ref) if self.job_of.get(ref, key) != key else set()
        value = self.extract(obj)
        kept = self.by_job.setdefault(key, {})
        if ref[1] not in kept or kept[ref[1]] != value:
            kept[ref[1]] = value
            self.job_of[ref] = key
            changed.add(key)
        return changed

    def replace(self, objs: Iterable[Mapping[str, Any]], namespace: str | None = None) -> set[Key]:
        """A full LIST (of one namespace, or of all) -> the jobs whose objects differ from what
        was kept."""
        fresh: Cache[T] = Cache(self.label, self.extract, self.job_name)
        for obj in objs:
            fresh.apply("ADDED", obj)
        ours = {k for k in self.by_job if namespace is None or k[0] == namespace}
        changed = {
            k for k in ours | fresh.by_job.keys() if self.by_job.get(k) != fresh.by_job.get(k)
        }
        for key in ours:
            for name, value in self.by_job.pop(key).items():
                del self.job_of[(key[0], name)]
                if self.removed is not None and (key[0], name) not in fresh.job_of:
                    self.removed(key, value)
        self.by_job.update(fresh.by_job)
        self.job_of.update(fresh.job_of)
        return changed

    def _remove(self, ref: Ref) -> set[Key]:
        key = self.job_of.pop(ref, None)
        if key is None:
            return set()
        kept = self.by_job[key]
        del kept[ref[1]]
        if not kept:
            del self.by_job[key]
        return {key}


@dataclass
class ByName(Generic[T]):
    """What is kept of each Node (``extract`` of its body), by name. Changes are reported as
    the key ("", node name): the controller reconciles the jobs with pods on it."""

    extract: Callable[[Mapping[str, Any]], T]
    label: str = ""  # no label selector: every Node
    by_name: dict[str, T] = field(default_factory=dict)

    def apply(self, event_type: str, obj: Mapping[str, Any]) -> set[Key]:
        name = (obj.get("metadata") or {}).get("name", "")
        if event_type == "DELETED":
            return {("", name)} if self.by_name.pop(name, None) is not None else set()
        value = self.extract(obj)
        if self.by_name.get(name) == value:
            return set()  # a heartbeat: nothing the planner reads changed
        self.by_name[name] = value
        return {("", name)}

    def replace(self, objs: Iterable[Mapping[str, Any]], namespace: str | None = None) -> set[Key]:
        fresh: ByName[T] = ByName(self.extract)
        for obj in objs:
            fresh.apply("ADDED", obj)
        names = self.by_name.keys() | fresh.by_name.keys()
        changed = {("", n) for n in names if self.by_name.get(n) != fresh.by_name.get(n)}
        self.by_name = fresh.by_name
        return changed


class Forbidden(Exception):
    """RBAC does not allow this LIST (or the API server does not serve the resource)."""


class Informer(Generic[T]):
    """Keeps ``cache`` equal to the objects of core ``plural`` (in ``namespace``, or in all) that
    have the cache's label, and calls ``on_change`` with each job whose objects changed."""

    def __init__(
        self,
        api: kube.Kube,
        plural: str,
        namespace: str | None,
        cache: Cache[T] | ByName[T],
        on_change: Callable[[Key], None],
        on_synced: Callable[[Informer[Any]], None] = lambda _: None,
        watch_s: int = WATCH_S,
        api_version: str = "v1",
        field_selector: str = "",  # e.g. metadata.name=X: one object, as RBAC resourceNames allow
    ):
        self.api, self.plural, self.namespace, self.cache = api, plural, namespace, cache
        self.field_selector = field_selector
        self.on_change, self.on_synced, self.watch_s = on_change, on_synced, watch_s
        if api_version != "v1":
            self.collection = (
                kube.group_path(api_version, namespace, plural)
                if namespace
                else f"/apis/{api_version}/{plural}"
            )
        else:
            self.collection = (
                kube.core_path(namespace, plural) if namespace else f"/api/v1/{plural}"
            )
        self.synced = asyncio.Event()  # set after the first LIST
        # Whether the cache is being kept current: after a LIST, or once a watch delivers an
        # event or ends as the server ends it, until a watch fails (then it retries, after a
        # backoff up to RETRY_CAP_S).
        self.following = False
        self.forbidden = False  # it stopped: RBAC forbade it, or the resource is not served
        self.resource_version = ""  # "" means: LIST first
        self.lists = 0  # how many LISTs and WATCHes, for tests and logs
        self.watches = 0

    def _url(self, **params: str) -> str:
        fields = {"fieldSelector": self.field_selector} if self.field_selector else {}
        return f"{self.collection}?" + urllib.parse.urlencode(
            {"labelSelector": self.cache.label, **fields, **params}
        )

    async def run(self, stop_if_forbidden: bool = False, stop_if_missing: bool = False) -> None:
        """Lists and watches until cancelled; errors are logged and retried with backoff. A
        forbidden LIST ends it when ``stop_if_forbidden``, and one of a resource the API server
        does not serve when ``stop_if_missing`` (raising :class:`Forbidden`)."""
        delay = 0.0
        while True:
            try:
                if not self.resource_version:
                    await self.relist()
                await self.watch()
                self.following = True  # the server ended it (timeoutSeconds): it was open
                delay = 0.0
            except asyncio.CancelledError:
                raise
            except Expired as e:
                log.info("watch of %s expired (%s); listing again", self.collection, e)
                self.resource_version = ""
            except Exception as e:  # the cache must never stop: retry whatever it was
                self.following = False
                status = e.response.status if isinstance(e, kube.KubeError) else 0
                if (status == 403 and stop_if_forbidden) or (status == 404 and stop_if_missing):
                    self.forbidden = True
                    raise Forbidden(str(e)) from e
                if status == 410:
                    self.resource_version = ""  # a LIST's continue token expired
                delay = min(max(2 * delay, 0.5), RETRY_CAP_S)
                log.warning("watch of %s failed: %r; again in %.1fs", self.collection, e, delay)
                await asyncio.sleep(delay)

    async def relist(self) -> None:
        items: list[dict[str, Any]] = []
        cont = ""
        while True:
            params = {"limit": str(PAGE), **({"continue": cont} if cont else {})}
            r = await self.api.must("GET", self._url(**params))
            items.extend(r.body.get("items") or [])
            meta = r.body.get("metadata") or {}
            cont = meta.get("continue") or ""
            if not cont:
                break
        changed = self.cache.replace(items, self.namespace)
        self.resource_version = meta["resourceVersion"]
        self.following = True
        self.lists += 1
        log.debug("listed %d from %s; %d jobs changed", len(items), self.collection, len(changed))
        if not self.synced.is_set():
            self.synced.set()
            self.on_synced(self)
        for key in changed:
            self.on_change(key)

    async def watch(self) -> None:
        """Follows the watch from ``resource_version`` until the server ends it."""
        self.watches += 1
        url = self._url(
            watch="true",
            allowWatchBookmarks="true",
            timeoutSeconds=str(self.watch_s),
            resourceVersion=self.resource_version,
        )
        try:
            async for event in self.api.stream(url, read_timeout_s=self.watch_s + 30):
                self.following = True
                kind, obj = event.get("type", ""), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Expired(obj.get("message", "410 Gone"))
                    raise RuntimeError(f"watch error: {obj.get('message') or obj}")
                if kind != "BOOKMARK":
                    for key in self.cache.apply(kind, obj):
                        self.on_change(key)
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if version:
                    self.resource_version = version
        except kube.KubeError as e:
            if e.response.status == 410:
                raise Expired(e.response.message) from e
            raise


class Watches:
    """The pod and Service informers (and Kueue's Workloads when the integration is on):
    cluster-wide, or per namespace when that is forbidden."""

    def __init__(
        self,
        api: kube.Kube,
        caches: Mapping[str, Cache[Any]],  # by plural
        on_change: Callable[[Key], None],
        on_synced: Callable[[str | None], None],  # a namespace (None: all) can be reconciled
        api_versions: Mapping[str, str] | None = None,  # by plural; "v1" when not named
    ):
        self.api, self.caches, self.on_change, self._on_synced = api, caches, on_change, on_synced
        self.api_versions = dict(api_versions or {})
        self.plurals = tuple(caches)
        self.cluster = [self._informer(p, None) for p in self.plurals]
        self.namespaced: dict[str, list[Informer[Any]]] | None = None  # None: cluster-wide
        self.tasks: set[asyncio.Task[None]] = set()

    def _informer(self, plural: str, namespace: str | None) -> Informer[Any]:
        return Informer(
            self.api,
            plural,
            namespace,
            self.caches[plural],
            self.on_change,
            self._synced,
            api_version=self.api_versions.get(plural, "v1"),
        )

    def start(self) -> None:
        for w in self.cluster:
            self._spawn(self._cluster_wide(w))

    def ready(self, namespace: str) -> bool:
        """Whether jobs of ``namespace`` can be planned; starts watching it if need be."""
        if self.namespaced is None:
            return _filled(self.cluster)
        if namespace not in self.namespaced:
            watches = self.namespaced[namespace] = [
                self._informer(p, namespace) for p in self.plurals
            ]
            log.info("watching pods and Services of namespace %s", namespace)
            for w in watches:
                self._spawn(w.run())
        return _filled(self.namespaced[namespace])

    async def stop(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def _synced(self, w: Informer[Any]) -> None:
        group = self.cluster if w.namespace is None else (self.namespaced or {}).get(w.namespace)
        if group and _filled(group):
            where = f"namespace {w.namespace}" if w.namespace else "all namespaces"
            log.info(
                "pods and Services of %s listed; %d pods cached", where, len(self.caches["pods"])
            )
            self._on_synced(w.namespace)

    async def _cluster_wide(self, w: Informer[Any]) -> None:
        try:
            await w.run(stop_if_forbidden=True)
        except Forbidden as e:
            if self.namespaced is None:
                log.info("%s; watching the namespaces of DDPJobs one by one instead", e)
                self.namespaced = {}
                for task in list(self.tasks):  # the other cluster-wide informer too
                    if task is not asyncio.current_task():
                        task.cancel()
                self._on_synced(None)  # the jobs waiting can now start their namespaces

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


def _filled(group: list[Informer[Any]]) -> bool:
    return all(w.synced.is_set() for w in group)
