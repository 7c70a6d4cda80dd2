"""The controller's hands: carries out a reconcile's plan (creates, deletes, Events, the job's
status write before or after them, as :func:`ddp_operator.bookkeeping.status_write` says; a
counted failure's Events before its status, under names that make a repeat AlreadyExists) and
remembers the status it wrote last, which the next reconcile prefers over a staler watch event.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ddp_api.contract import API_VERSION, KIND, PLURAL
from ddp_api.ddpjob import RESTART_REASONS, DDPJob, EventType, Reason
from ddp_api.metav1 import owner_reference
from ddp_api.status import StatusFields

from . import bookkeeping, kube
from .metrics import OperatorMetrics
from .planner.decision import EventNote
from .planner.draft import Plan
from .trainer_objects import TrainerObjects

log = logging.getLogger("ddp_operator")

COMPONENT = "ddp-operator"


def missing_account(status: int, message: str) -> bool:
    """Whether admission refused a pod because its ServiceAccount does not exist."""
    return status == 403 and "error looking up service account" in message


@dataclass
class Actions:
    metrics: OperatorMetrics
    trainer: TrainerObjects
    api: kube.Kube
    instance: str = COMPONENT  # reportingInstance of its Events: the pod's name in a cluster
    written: dict[str, StatusFields] = field(default_factory=dict)  # job uid -> our status
    status_written_at: dict[str, float] = field(default_factory=dict)  # job uid -> monotonic

    def forget(self, uid: str) -> None:
        self.written.pop(uid, None)
        self.status_written_at.pop(uid, None)

    async def run(
        self,
        body: dict[str, Any],
        job: DDPJob | None,
        status: StatusFields,
        p: Plan,
        in_pod: bool = True,
    ) -> list[dict[str, Any]]:
        """Carries out ``p``, and writes status before or after, as
        :func:`bookkeeping.status_write` says; returns the objects created. ``in_pod``: the
        new pods run as the namespace's trainer account (else as the job's own)."""
        meta = body["metadata"]
        ns, name, uid = meta["namespace"], meta["name"], meta.get("uid", "")
        job_path = kube.group_path(API_VERSION, ns, PLURAL, name)
        diff = bookkeeping.status_diff(status, p.status)
        never = -bookkeeping.STATUS_COUNTS_EVERY_S
        since = time.monotonic() - self.status_written_at.get(uid, never)
        changed, counted, wait = bookkeeping.status_write(diff, since)
        if wait is not None:
            p.requeue(wait)

        async def write_status() -> bool:
            r = await self.api.must(
                "PATCH", job_path + "/status", {"status": p.status}, kube.MERGE_PATCH, ok=(404,)
            )
            if r.status == 404:
                return False  # the job is gone; its pods go with it
            self.written[uid] = StatusFields(**p.status)
            self.status_written_at[uid] = time.monotonic()
            return True

        # A counted failure's Events go before its status write (and the pods after it), named
        # after the failures they tell of: a leader lost anywhere in between leaves its
        # successor to count them again and post the same names, never a count without its
        # Event nor an Event twice.
        counted_uids = bookkeeping.newly_handled(status, p.status) if changed and counted else []
        if counted_uids:
            await self._events(body, p.events, counted_uids)
        if changed and counted and not await write_status():
            return []
        starts = job if job is not None and any(o["kind"] == "Pod" for o in p.create) else None
        account = self.trainer.account(starts, in_pod) if starts is not None else None
        if account is not None:
            await asyncio.shield(account)  # admission refuses a pod whose account is not there
        created = await asyncio.gather(*(self._create(obj, body) for obj in p.create))
        await asyncio.gather(*(self._adopt(ns, svc, meta) for svc in p.adopt))
        if starts is not None:
            self.trainer.for_reports(starts, in_pod)  # needed once rank 0 reports: after the pods
        self.metrics.pod_creates.inc(
            sum(1 for o, ok in zip(p.create, created, strict=True) if ok and o["kind"] == "Pod")
        )
        await asyncio.gather(
            *(
                self.api.must("DELETE", kube.core_path(ns, "pods", pod), ok=(404,))
                for pod in p.delete
            ),
            *(  # on a lost machine: its kubelet cannot confirm a graceful end
                self.api.must(
                    "DELETE", kube.core_path(ns, "pods", pod) + "?gracePeriodSeconds=0", ok=(404,)
                )
                for pod in p.force
            ),
        )
        self.metrics.pod_deletes.inc(len(p.delete) + len(p.force))
        if not counted_uids:
            await self._events(body, p.events, [])
        for _, reason, _ in p.events:
            if reason in RESTART_REASONS:
                self.metrics.restarts.labels(reason).inc()
        if changed and not counted:
            await write_status()
        self.metrics.incidents_closed(p.closed)
        if p.delete_job:
            await self.api.must("DELETE", job_path + "?propagationPolicy=Background", ok=(404,))
            self.written.pop(uid, None)
        return [o for o, ok in zip(p.create, created, strict=True) if ok]

    async def _create(self, obj: dict[str, Any], body: dict[str, Any]) -> bool:
        r = await self.api.call("POST", kube.path_of(obj), obj)
        if r.ok:
            return True
        if obj["kind"] == "Pod" and missing_account(r.status, r.message):
            self.trainer.account_missing(obj["metadata"]["namespace"])
        if r.status != 409:  # 409: already there, idempotent by name
            # Refused (quota, admission, a bad override): say why where the user looks.
            await self.event(
                body,
                EventType.WARNING,
                Reason.CREATE_FAILED,
                f"creating {obj['kind']} {obj['metadata']['name']} failed: {r.message}",
            )
        return False

    async def _adopt(self, ns: str, service: str, job_meta: dict[str, Any]) -> None:
        """Makes the job the controller of an orphaned Service of its name (a strategic merge
        patch adds the ownerReference beside any the Service has, as Kubernetes' controllers
        adopt), so that it goes with the job."""
        patch = {"metadata": {"ownerReferences": [owner_reference(job_meta)]}}
        path = kube.core_path(ns, "services", service)
        r = await self.api.must("PATCH", path, patch, kube.STRATEGIC_MERGE_PATCH, ok=(404,))
        if r.ok:
            log.info("adopted Service %s/%s, which nothing controlled", ns, service)

    async def _events(
        self, body: dict[str, Any], events: list[EventNote], counted_uids: list[str]
    ) -> None:
        """Posts ``events``: named after ``counted_uids`` when they tell of those failures."""
        reasons = [reason for _, reason, _ in events]
        names: Sequence[str | None] = (
            bookkeeping.counted_event_names(body["metadata"], counted_uids, reasons)
            if counted_uids
            else [None] * len(events)
        )
        await asyncio.gather(
            *(self.event(body, *e, name=n) for e, n in zip(events, names, strict=True))
        )

    async def event(
        self,
        body: dict[str, Any],
        etype: EventType,
        reason: str,
        text: str,
        name: str | None = None,
    ) -> None:
        """Posts an Event about the job; ``name``, when given, makes a repeat an AlreadyExists."""
        meta = body["metadata"]
        event = bookkeeping.event_body(
            meta,
            etype,
            reason,
            text,
            name=name or f"{meta['name']}.{uuid.uuid4().hex[:16]}",
            now=dt.datetime.now(dt.UTC),
            component=COMPONENT,
            instance=self.instance,
            api_version=API_VERSION,
            kind=KIND,
        )
        r = await self.api.call("POST", kube.path_of(event), event)
        if r.status == 409 and name is not None:
            log.info("%s %s/%s: already told (Event %s)", reason, meta["namespace"], meta["name"],
                     name)  # fmt: skip
            return
        if not r.ok:  # an Event is worth a log line, never a failed reconcile
            log.warning("could not post event %s on %s: %s", reason, meta["name"], r.message)
        log.info("%s %s/%s: %s", reason, meta["namespace"], meta["name"], text)
