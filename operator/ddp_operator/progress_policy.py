"""Whether the cluster confines the namespaces' trainer account: the chart's
ValidatingAdmissionPolicy ``<release>-trainer-progress`` and its binding, watched by name. The
account may patch pods only while both are in force (the policy fails closed, the binding
denies, everywhere); the operator grants it in a namespace only then, and withdraws its grants
when either goes (:class:`~ddp_operator.trainer_objects.TrainerObjects`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import informer, kube, render

log = logging.getLogger("ddp_operator")

ADMISSION = "admissionregistration.k8s.io/v1"
POLICIES, BINDINGS = "validatingadmissionpolicies", "validatingadmissionpolicybindings"


def policy_in_force(policy: Mapping[str, Any]) -> bool:
    """A policy that fails closed: a rule that cannot be evaluated refuses the request."""
    return bool((policy.get("spec") or {}).get("failurePolicy", "Fail") == "Fail")


def binding_in_force(binding: Mapping[str, Any]) -> bool:
    """A binding of the policy of its own name that denies (not only audits or warns), in every
    namespace and for every object."""
    spec = binding.get("spec") or {}
    match = spec.get("matchResources") or {}
    return bool(
        spec.get("policyName") == (binding.get("metadata") or {}).get("name")
        and "Deny" in (spec.get("validationActions") or [])
        and not any(
            match.get(k)
            for k in (
                "namespaceSelector",
                "objectSelector",
                "resourceRules",
                "excludeResourceRules",
            )
        )
    )


@dataclass
class ProgressPolicy:
    """The policy and its binding as this operator sees them; ``changed`` is told whether they
    are in force whenever that changes, once first known."""

    name: str = render.DEFAULT_TRAINER_POLICY  # of the policy and of its binding
    changed: Callable[[bool], None] = lambda _: None
    policies: informer.ByName[bool] = field(
        default_factory=lambda: informer.ByName(policy_in_force)
    )
    bindings: informer.ByName[bool] = field(
        default_factory=lambda: informer.ByName(binding_in_force)
    )
    known: asyncio.Event = field(default_factory=asyncio.Event)  # both read once, or unreadable
    unreadable: str = ""  # why the operator may not read them (RBAC, or no such API)
    synced: set[str] = field(default_factory=set)
    last: bool | None = None

    @property
    def in_force(self) -> bool:
        return (
            not self.unreadable
            and self.policies.by_name.get(self.name, False)
            and self.bindings.by_name.get(self.name, False)
        )

    def why_not(self) -> str:
        """Why the policy is not in force, for a log line or an Event."""
        if self.unreadable:
            return f"the operator cannot read it ({self.unreadable})"
        if not self.known.is_set():
            return "the operator has not read it yet"
        for what, cache in (("ValidatingAdmissionPolicy", self.policies),
                            ("ValidatingAdmissionPolicyBinding", self.bindings)):  # fmt: skip
            if self.name not in cache.by_name:
                return f"there is no {what} {self.name}"
            if not cache.by_name[self.name]:
                return f"the {what} {self.name} is not in force (failurePolicy, actions or scope)"
        return ""

    def start(self, api: kube.Kube, spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        for plural, cache in ((POLICIES, self.policies), (BINDINGS, self.bindings)):
            w = informer.Informer(
                api, plural, None, cache, self._changed, self._synced,
                api_version=ADMISSION, field_selector=f"metadata.name={self.name}",
            )  # fmt: skip
            spawn(self._keep(w))

    async def wait_known(self, timeout_s: float) -> None:
        """Until both were read once (or found unreadable); at most ``timeout_s``, after which
        the policy counts as not in force."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.known.wait(), timeout_s)

    def _synced(self, w: informer.Informer[Any]) -> None:
        self.synced.add(w.plural)
        if self.synced >= {POLICIES, BINDINGS}:
            self._known()

    def _changed(self, _: tuple[str, str]) -> None:
        if self.known.is_set():
            self._tell()

    def _known(self) -> None:
        if not self.known.is_set():
            self.known.set()
            self._tell()

    def _tell(self) -> None:
        now = self.in_force
        if now == self.last:
            return
        if now:
            log.info(
                "admission policy %s in force: trainer pods report into their own pod", self.name
            )
        else:
            log.warning(
                "admission policy %s not in force: %s; trainer pods run as their job's own "
                "account and report into its ConfigMap",
                self.name,
                self.why_not(),
            )
        self.last = now
        self.changed(now)

    async def _keep(self, w: informer.Informer[Any]) -> None:
        try:
            await w.run(stop_if_forbidden=True, stop_if_missing=True)
        except informer.Forbidden as e:
            self.unreadable = str(e)
            self._known()
            self._tell()
