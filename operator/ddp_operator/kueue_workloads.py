"""A queued job's Kueue Workload: the I/O half of :mod:`ddp_operator.queueing`, which decides.

The Workload is created for a job that has none, resized or (de)activated when the job's spec
changes while queued, read for Kueue's admission (with the ResourceFlavors it names), and its
status written as Kueue's own job reconciler writes it: quota released once an evicted job's
pods are gone, Finished once the job is.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ddp_api.contract import rfc3339
from ddp_api.ddpjob import TERMINAL_PHASES, DDPJob, DDPJobPhase
from ddp_api.status import StatusFields

from . import informer, kube, queueing, render
from .planner.views import PodView

Key = tuple[str, str]


@dataclass
class KueueWorkloads:
    """The Workloads of queued jobs (a watch keeps ``cache``), and what was read to admit them."""

    api: kube.Kube
    cache: informer.Cache[dict[str, Any]] = field(
        default_factory=lambda: informer.Cache(render.LABEL_JOB, _workload_view)
    )
    flavors: dict[str, dict[str, Any]] = field(default_factory=dict)  # ResourceFlavors read
    priorities: dict[str, int | None] = field(default_factory=dict)  # PriorityClass values read

    def of(self, key: Key, job: DDPJob) -> dict[str, Any] | None:
        name = queueing.workload_name(job)
        return next((w for w in self.cache.get(key) if w["metadata"]["name"] == name), None)

    async def admission(
        self,
        job: DDPJob,
        worker: Callable[[], dict[str, Any]],
        queue: str,
        workload: dict[str, Any] | None,
        status: StatusFields,
    ) -> queueing.Admission:
        """Creates the job's Workload if it has none; returns what Kueue decided. ``worker``
        renders the job's pod (only to create the Workload, which asks quota for
        ``spec.nodes`` of it)."""
        if workload is None:
            if status.get("phase") not in TERMINAL_PHASES:
                pod = worker()
                pcn = pod["spec"].get("priorityClassName")
                priority = await self._priority(pcn) if pcn else None
                wl = queueing.render_workload(job, pod, queue, priority, render.LABEL_JOB)
                await self.api.must("POST", _path(wl), wl, ok=(409,))
            return queueing.admission(None, queue)
        path = _path(workload, workload["metadata"]["name"])
        patch = queueing.resize(job, workload)
        if patch is not None:  # spec.nodes changed while queued; 422: Kueue reserved meanwhile
            await self.api.must("PATCH", path, patch, kube.MERGE_PATCH, ok=(404, 409, 422))
        patch = queueing.activation(job, workload)
        if patch is not None:  # spec.suspend changed
            await self.api.must("PATCH", path, patch, kube.MERGE_PATCH, ok=(404,))
        adm = queueing.admission(workload, queue)
        if adm.state == queueing.State.ADMITTED and adm.flavors:
            adm = queueing.with_flavors(adm, {f: await self._flavor(f) for f in adm.flavors})
        return adm

    async def sync(
        self,
        workload: dict[str, Any],
        observed: Sequence[PodView],
        status: StatusFields,
    ) -> None:
        """Releases an evicted Workload's quota once the job's pods are gone; marks the Workload
        of a finished job Finished (both applied as Kueue's own job reconciler applies them)."""
        now = rfc3339(dt.datetime.now(dt.UTC))
        phase = status.get("phase")
        if phase in TERMINAL_PHASES:
            conds = status.get("conditions") or []
            message = next((c.get("message", "") for c in conds if c["type"] == phase), "")
            body = queueing.finish(
                workload, phase == DDPJobPhase.SUCCEEDED, message or str(phase), now
            )
        elif all(v.done for v in observed):
            body = queueing.release(workload, now)
        else:
            body = None
        if body is not None:
            path = _path(workload, workload["metadata"]["name"]) + "/status"
            query = f"?fieldManager={queueing.ADMISSION_MANAGER}&force=true"
            # 409: the Workload changed since it was read; its watch event reconciles again.
            await self.api.must("PATCH", path + query, body, queueing.APPLY_PATCH, ok=(404, 409))

    async def _flavor(self, name: str) -> dict[str, Any]:
        if name not in self.flavors:
            path = f"/apis/{queueing.KUEUE_API}/{queueing.RESOURCE_FLAVORS}/{name}"
            r = await self.api.must("GET", path)
            self.flavors[name] = {"spec": r.body.get("spec") or {}}
        return self.flavors[name]

    async def _priority(self, name: str) -> int | None:
        if name not in self.priorities:
            r = await self.api.must(
                "GET", f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}", ok=(404,)
            )
            self.priorities[name] = r.body.get("value") if r.ok else None
        return self.priorities[name]


def _workload_view(obj: Any) -> dict[str, Any]:
    """A Workload as kept in the cache: all of it but the managed fields."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    return {"metadata": meta, "spec": obj.get("spec") or {}, "status": obj.get("status") or {}}


def _path(wl: dict[str, Any], name: str = "") -> str:
    ns = wl["metadata"]["namespace"]
    return kube.group_path(queueing.KUEUE_API, ns, queueing.WORKLOADS, name)
