"""What a job's training pods need besides themselves, made by the controller: where the
admission policy is in force (:mod:`~ddp_operator.progress_policy`), the namespace's trainer
account and its RoleBinding, made once per namespace, withdrawn when the policy goes; where it
is not, each job's own account, whose Role may patch its progress ConfigMap and nothing else
(:func:`render.render_trainer_identity`), and that ConfigMap; and the retirement of release
0.1.0's namespace-wide account once no pod runs as it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from ddp_api.ddpjob import DDPJob

from . import informer, kube, render
from .planner.views import PodView
from .progress_policy import ProgressPolicy

log = logging.getLogger("ddp_operator")

POLICY_WAIT_S = 10.0  # a job waits this long at most for the policy's first read
RBAC = "rbac.authorization.k8s.io/v1"


@dataclass
class TrainerObjects:
    pods: informer.Cache[PodView]  # the controller's pod cache (who runs as what)
    api: kube.Kube
    spawn: Callable[[Coroutine[Any, Any, None]], None]
    policy: ProgressPolicy = field(default_factory=ProgressPolicy)
    # (what, job uid or namespace) -> the create of a job's trainer ServiceAccount, Role+binding,
    # ConfigMap, or of a namespace's trainer account or its RoleBinding
    made: dict[tuple[str, str], asyncio.Future[None]] = field(default_factory=dict)
    granted: set[str] = field(default_factory=set)  # namespaces whose RoleBinding we made or met
    withdrawn: set[str] = field(default_factory=set)  # ... deleted since the policy went
    told: set[str] = field(default_factory=set)  # namespaces told that the policy is not in force
    legacy: LegacyAccount = field(init=False)  # release 0.1.0's namespace-wide account

    def __post_init__(self) -> None:
        self.policy.changed = self._policy_changed
        self.legacy = LegacyAccount(self.pods, self.api)

    def start(self, policy: str) -> None:
        """Reads the admission policy (and binding) ``policy``, the name also of the ClusterRole
        that the namespaces' RoleBindings grant."""
        self.policy.name = policy
        self.policy.start(self.api, self.spawn)

    async def in_pod(self, job: DDPJob) -> bool:
        """Whether the job's new pods report into their own pod, as the namespace's account
        (the policy is in force), or into the job's ConfigMap. A job of the bundled trainer
        waits for the policy's first read, so that no job starts on a guess."""
        if render.reports_progress(job) and not self.policy.known.is_set():
            await self.policy.wait_known(POLICY_WAIT_S)
        return self.policy.in_force

    def news(self, job: DDPJob, in_pod: bool) -> str:
        """Why a bundled-trainer job's pods report through per-job objects, said once per
        namespace and process (an Event on the job); "" when that is no news."""
        ns = render.job_key(job)[0]
        if in_pod or not render.reports_progress(job) or ns in self.told:
            return ""
        self.told.add(ns)
        return (
            f"the admission policy {self.policy.name} is not in force "
            f"({self.policy.why_not()}): the pods of this job, and of every job of namespace "
            f"{ns} while it is not, report progress through a ServiceAccount, Role, RoleBinding "
            "and ConfigMap of their own job"
        )

    def account(self, job: DDPJob, in_pod: bool) -> asyncio.Future[None] | None:
        """Begins the create of the ServiceAccount the job's pods run as: the namespace's
        (``in_pod``) or the job's own, the one that may patch its progress ConfigMap and nothing
        else; None where its pods need none of ours (no progress reports, or the user's own
        account: theirs to grant). Pods wait for it: admission refuses a pod whose
        ServiceAccount does not exist.

        Each object is made once per job (or namespace) and operator process (a repeat after a
        restart meets 409); concurrent reconciles share one attempt, and a failed one is tried
        again by the next reconcile.
        """
        if not render.uses_trainer_account(job):
            return None
        ns, _, uid = render.job_key(job)
        if in_pod:
            return self._once(
                ("namespace-account", ns),
                lambda: self._post(render.render_namespace_trainer(ns)[0]),
            )
        return self._once(
            ("account", uid), lambda: self._post(render.render_trainer_identity(job)[0])
        )

    def for_reports(self, job: DDPJob, in_pod: bool) -> None:
        """Begins what rank 0's reports need besides the account, seconds after the pods: the
        namespace's RoleBinding (``in_pod``: once per namespace), or the job's progress
        ConfigMap and, with the job's own account, its Role and RoleBinding that let it patch
        that ConfigMap (made after the pods: nothing waits for them)."""
        if not render.reports_progress(job):
            return
        ns, _, uid = render.job_key(job)
        if in_pod:
            if render.uses_trainer_account(job):
                self.grant(ns)
            return
        self._once(("progress", uid), lambda: self._post(render.render_progress_configmap(job)))
        if render.uses_trainer_account(job):
            # RBAC checks a new binding against its Role, so the Role must exist first.
            self._once(
                ("rbac", uid), lambda: self._post_all(*render.render_trainer_identity(job)[1:])
            )

    def grant(self, ns: str) -> None:
        """Begins the create of the namespace's RoleBinding (once per namespace and process)
        while the policy is in force: with it the namespace's account may patch pods, and the
        policy lets it change only its own pod's progress annotation."""
        if self.policy.in_force:
            self._once(("namespace-rbac", ns), lambda: self._grant(ns))

    def settle(self, ns: str, observed: list[PodView]) -> None:
        """Keeps the namespace's grant as the policy says, for a reconcile of one of its jobs
        (``observed``: its pods): granted while they run as the namespace's account and the
        policy is in force (also after a restart of the operator, or the policy's return); else
        withdrawn."""
        runs = any(v.account == render.PROGRESS_ACCOUNT for v in observed)
        if self.policy.in_force:
            if runs:
                self.grant(ns)
        elif self.policy.known.is_set() and (runs or ns in self.granted):
            self.withdraw_soon(ns)

    def account_missing(self, ns: str) -> None:
        """Admission refused a pod of ``ns`` for want of its ServiceAccount, which this process
        made before: the namespace was deleted and made again under the same name (its objects
        went with it). The next reconcile makes the namespace's account and grant again."""
        self.made.pop(("namespace-account", ns), None)
        self.made.pop(("namespace-rbac", ns), None)
        self.granted.discard(ns)

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
        await self.api.must("POST", kube.path_of(obj), obj, ok=(409,))  # 409: already there

    async def _post_all(self, *objs: dict[str, Any]) -> None:
        for obj in objs:
            await self._post(obj)

    async def _grant(self, ns: str) -> None:
        await self._post(render.render_namespace_trainer(ns, self.policy.name)[1])
        self.granted.add(ns)
        self.withdrawn.discard(ns)

    def _policy_changed(self, in_force: bool) -> None:
        """The policy came or went: gone, every grant is withdrawn at once (pods keep running,
        their reports are refused; new pods run as their job's own account); back, each
        namespace is granted again at the next reconcile of a job whose pods need it."""
        self.told.clear()
        if in_force:
            self.withdrawn.clear()
            return
        for ns in sorted(self.granted | {ns for ns, _ in self.pods.by_job}):
            self.made.pop(("namespace-rbac", ns), None)
            if ns in self.granted or any(
                v.account == render.PROGRESS_ACCOUNT for v in self.pods.in_namespace(ns)
            ):
                self.withdraw_soon(ns)

    def withdraw_soon(self, ns: str) -> None:
        if ns in self.withdrawn:
            return
        self.withdrawn.add(ns)
        self.made.pop(("namespace-rbac", ns), None)
        self.spawn(self._withdraw(ns))

    async def _withdraw(self, ns: str) -> None:
        """Deletes the namespace's RoleBinding: without the policy, ``patch`` on pods would
        reach every pod of the namespace."""
        path = kube.group_path(RBAC, ns, "rolebindings", render.PROGRESS_ACCOUNT)
        try:
            r = await self.api.call("DELETE", path)
        except kube.NotLeading:  # the leader withdraws it; this replica, once it leads (settle)
            self.withdrawn.discard(ns)
            raise
        if r.ok or r.status == 404:
            self.granted.discard(ns)
            if r.ok:
                log.warning("deleted %s: the admission policy is not in force", path)
        else:  # tried again by the namespace's next reconcile
            log.warning("could not delete %s: %s", path, r.message)
            self.withdrawn.discard(ns)


@dataclass
class LegacyAccount:
    """Release 0.1.0's namespace-wide trainer account, retired once no pod runs as it."""

    pods: informer.Cache[PodView]  # the controller's pod cache (who runs as what)
    api: kube.Kube
    legacy_retired: set[str] = field(default_factory=set)  # namespaces without the account
    retiring: set[str] = field(default_factory=set)  # ... being checked now

    def retire_soon(self, ns: str, spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        """Checks ``ns`` for release 0.1.0's account in the background, one check at a time,
        until it is gone (off the reconcile's path)."""
        if ns not in self.legacy_retired and ns not in self.retiring:
            self.retiring.add(ns)
            spawn(self.retire(ns))

    async def retire(self, ns: str) -> None:
        """Removes release 0.1.0's namespace-wide trainer account (its Role could patch the
        status of any DDPJob of the namespace) once no pod of ``ns`` runs as it any more.

        Until then its pods keep reporting through it: the old path is accepted only as long as
        the pods the old release started live (a pod is replaced with a trainer account of
        this release).
        """
        try:
            await self._retire(ns)
        finally:
            self.retiring.discard(ns)

    async def _retire(self, ns: str) -> None:
        if any(v.account == render.LEGACY_TRAINER_ACCOUNT for v in self.pods.in_namespace(ns)):
            return
        name = render.LEGACY_TRAINER_ACCOUNT
        for path in (
            kube.group_path(RBAC, ns, "rolebindings", name),
            kube.group_path(RBAC, ns, "roles", name),
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
