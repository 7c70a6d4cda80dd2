"""What a job's training pods need besides themselves, made by the controller: the progress
ConfigMap that rank 0 patches and the ServiceAccount that may patch it and nothing else
(:func:`render.render_trainer_identity`); and the retirement of release 0.1.0's namespace-wide
trainer account once no pod runs as it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from ddp_api.ddpjob import DDPJob

from . import informer, kube, render
from . import plan as planner

log = logging.getLogger("ddp_operator")


@dataclass
class TrainerObjects:
    pods: informer.Cache[planner.PodView]  # the controller's pod cache (who runs as what)
    api: kube.Kube | None = None
    # (what, job uid) -> the create of a job's trainer ServiceAccount, Role+binding, ConfigMap
    made: dict[tuple[str, str], asyncio.Future[None]] = field(default_factory=dict)
    legacy_retired: set[str] = field(default_factory=set)  # namespaces without 0.1.0's account
    retiring: set[str] = field(default_factory=set)  # ... being checked now

    def account(self, job: DDPJob) -> asyncio.Future[None] | None:
        """Begins the create of the job's trainer ServiceAccount, the one that may patch its
        progress ConfigMap and nothing else; None where its pods need none of ours (no progress
        reports, or the user's own account: theirs to grant). Pods wait for it: admission
        refuses a pod whose ServiceAccount does not exist.

        Each object is made once per job and operator process (a repeat after a restart meets
        409); concurrent reconciles share one attempt, and a failed one is tried again by the
        next reconcile.
        """
        if not render.uses_trainer_account(job):
            return None
        return self._once(
            ("account", render.job_key(job)[2]),
            lambda: self._post(render.render_trainer_identity(job)[0]),
        )

    def for_reports(self, job: DDPJob) -> None:
        """Begins what rank 0's reports need besides the account, seconds after the pods: the
        progress ConfigMap and, with our account, the Role and RoleBinding that let it patch
        that ConfigMap (made after the pods: nothing waits for them)."""
        if not render.reports_progress(job):
            return
        uid = render.job_key(job)[2]
        self._once(("progress", uid), lambda: self._post(render.render_progress_configmap(job)))
        if render.uses_trainer_account(job):
            # RBAC checks a new binding against its Role, so the Role must exist first.
            self._once(
                ("rbac", uid), lambda: self._post_all(*render.render_trainer_identity(job)[1:])
            )

    def forget(self, uid: str) -> None:
        for what in ("account", "rbac", "progress"):
            self.made.pop((what, uid), None)

    def _once(self, key: tuple[str, str], make: Any) -> asyncio.Future[None]:
        task = self.made.get(key)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = self.made[key] = asyncio.ensure_future(make())
            task.add_done_callback(_log_failure)
        return task

    async def _post(self, obj: dict[str, Any]) -> None:
        assert self.api is not None
        await self.api.must("POST", kube.path_of(obj), obj, ok=(409,))  # 409: already there

    async def _post_all(self, *objs: dict[str, Any]) -> None:
        for obj in objs:
            await self._post(obj)

    def retire_legacy_soon(
        self, ns: str, spawn: Callable[[Coroutine[Any, Any, None]], None]
    ) -> None:
        """Checks ``ns`` for release 0.1.0's account in the background, one check at a time,
        until it is gone (off the reconcile's path)."""
        if ns not in self.legacy_retired and ns not in self.retiring:
            self.retiring.add(ns)
            spawn(self.retire_legacy(ns))

    async def retire_legacy(self, ns: str) -> None:
        """Removes release 0.1.0's namespace-wide trainer account (its Role could patch the
        status of any DDPJob of the namespace) once no pod of ``ns`` runs as it any more.

        Until then its pods keep reporting through it: the old path is accepted only as long as
        the pods the old release started live (a pod is replaced with the job's own account).
        """
        try:
            await self._retire_legacy(ns)
        finally:
            self.retiring.discard(ns)

    async def _retire_legacy(self, ns: str) -> None:
        assert self.api is not None
        if any(v.account == render.LEGACY_TRAINER_ACCOUNT for v in self.pods.in_namespace(ns)):
            return
        name = render.LEGACY_TRAINER_ACCOUNT
        rbac = "rbac.authorization.k8s.io/v1"
        for path in (
            kube.group_path(rbac, ns, "rolebindings", name),
            kube.group_path(rbac, ns, "roles", name),
            kube.core_path(ns, "serviceaccounts", name),
        ):
            r = await self.api.call("DELETE", path)
            if r.ok:
                log.info("deleted %s: no pod of %s runs as %s any more", path, ns, name)
            elif r.status != 404:  # a cleanup: tried again by the namespace's next reconcile
                log.warning("could not delete %s: %s", path, r.message)
                return
        self.legacy_retired.add(ns)


def _log_failure(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("creating a trainer's objects failed (tried again): %s", task.exception())
