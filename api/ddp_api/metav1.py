"""What Kubernetes' metav1 says about owners and conditions, written once and without I/O: the
owner reference that ties an object to its DDPJob, and when a condition's lastTransitionTime
moves. render, queueing, the planner and the client all build theirs here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .contract import API_VERSION, KIND


def controller_uid(meta: Mapping[str, Any]) -> str:
    """The uid of the object that controls the one of ``meta`` (its ownerReference with
    ``controller: true``); "" when none does (orphaned, or made by hand)."""
    refs = meta.get("ownerReferences") or []
    return next((str(r.get("uid", "")) for r in refs if r.get("controller")), "")


def owner_reference(job_meta: Mapping[str, Any], *, controller: bool = True) -> dict[str, Any]:
    """An ownerReference to the DDPJob of ``job_meta``: the garbage collector deletes the object
    with the job. ``controller``: the operator's own objects, which it reconciles and which hold
    up the job's foreground deletion; the client's objects are merely owned (blocking the job's
    deletion needs permissions a user may not have)."""
    ref: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": str(job_meta["name"]),
        "uid": str(job_meta.get("uid", "")),
    }
    if controller:
        ref["controller"] = True
        ref["blockOwnerDeletion"] = True
    return ref


def transition_time(old: Mapping[str, Any] | None, status: str, now: str) -> str:
    """A condition's lastTransitionTime, as metav1's SetStatusCondition sets it: it moves to
    ``now`` only when the condition's status flips (or it had none); else it stays."""
    if old is not None and old.get("status") == status and old.get("lastTransitionTime"):
        return str(old["lastTransitionTime"])
    return now
