"""Kueue, pure: the Workload a queued DDPJob asks Kueue to admit, what Kueue decided, and the
status writes Kueue expects of an external framework (``integrations.externalFrameworks``).

A DDPJob with the label ``kueue.x-k8s.io/queue-name`` (and the operator started with
``DDP_KUEUE=true``) gets one Workload, owned by the job: one pod set ``node`` of ``spec.nodes``
pods with the worker pod's containers (their requests), scheduling fields and priority class.
Until the Workload is Admitted the job has no pods (phase Queued). Admitted, its pods get the
assigned flavors' node labels and tolerations. Evicted (preempted, ...), its pods are deleted
(rank 0 checkpoints on SIGTERM); once none is left the quota reservation is released as Kueue's
own job reconciler does (``pkg/controller/jobframework/reconciler.go``, "handle eviction": the
admission cleared, QuotaReserved=False, Requeued set, applied as field manager
``kueue-admission``), so Kueue can admit the job again. A finished job marks its Workload
Finished, again as that reconciler does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ddp_api.contract import KIND
from ddp_api.ddpjob import ConditionStatus, DDPJob, PodTemplateOverrides
from ddp_api.metav1 import owner_reference, transition_time

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_API = f"{KUEUE_GROUP}/v1beta2"
WORKLOADS = "workloads"
RESOURCE_FLAVORS = "resourceflavors"
POD_SET = "node"
# Kueue's field manager for admission status (pkg/constants: AdmissionName): applying as it, with
# status.admission left out, removes the admission that Kueue's scheduler applied.
ADMISSION_MANAGER = "kueue-admission"
APPLY_PATCH = "application/apply-patch+yaml"
# The conditions Kueue applies as ADMISSION_MANAGER (pkg/workload/patching: admissionManaged...).
ADMISSION_CONDITIONS = (
    "QuotaReserved",
    "BlockedOnPreemptionGates",
    "Evicted",
    "Admitted",
    "Preempted",
    "Requeued",
    "DeactivationTarget",
    "Finished",
    "PodsReady",
)


class WorkloadCondition(StrEnum):
    """The Workload conditions (Kueue's API) this module reads or applies."""

    QUOTA_RESERVED = "QuotaReserved"
    EVICTED = "Evicted"
    ADMITTED = "Admitted"
    REQUEUED = "Requeued"
    FINISHED = "Finished"


class WorkloadReason(StrEnum):
    """Kueue's reasons of the Workload conditions this module applies or reads."""

    PENDING = "Pending"  # QuotaReserved=False: waiting in the queue
    NO_RESERVATION = "NoReservation"  # Admitted=False after an eviction's release
    SUCCEEDED = "Succeeded"  # Finished=True
    FAILED = "Failed"
    # Eviction reasons after which Kueue's reconciler sets Requeued=True (the others False).
    PREEMPTED = "Preempted"
    NODE_FAILURES = "NodeFailures"


REQUEUED_REASONS = (WorkloadReason.PREEMPTED, WorkloadReason.NODE_FAILURES)


class State(StrEnum):
    QUEUED = "Queued"  # no Workload yet, or no quota reserved
    ADMITTED = "Admitted"
    EVICTED = "Evicted"  # pods must go; the reservation is released once they are gone


@dataclass(frozen=True)
class Admission:
    """What Kueue decided for a job's Workload, as the planner needs it."""

    state: State
    queue: str
    workload: str = ""
    cluster_queue: str = ""
    count: int | None = None  # pods admitted (fewer than spec.nodes with partial admission)
    flavors: tuple[str, ...] = ()  # ResourceFlavors assigned to the pod set
    reason: str = ""  # Kueue's condition reason (Pending, Preempted, Admitted, ...)
    message: str = ""  # Kueue's condition message
    # The flavors' spec.nodeLabels and spec.tolerations, filled in by the shell.
    node_labels: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()


def queue_name(meta: Mapping[str, Any]) -> str:
    """The LocalQueue a job asks for (its ``kueue.x-k8s.io/queue-name`` label), or ""."""
    return str((meta.get("labels") or {}).get(QUEUE_LABEL) or "")


def workload_name(job: DDPJob) -> str:
    """``ddpjob-<name>-<hash>``: one per job (uid), the same after an operator restart."""
    meta = job.metadata
    digest = hashlib.sha256(f"{KIND}/{meta['name']}/{meta.get('uid', '')}".encode()).hexdigest()
    return f"ddpjob-{meta['name']}-{digest[:5]}"


def find_condition(wl: Mapping[str, Any], ctype: str) -> dict[str, Any] | None:
    for c in (wl.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return dict(c)
    return None


def _true(wl: Mapping[str, Any], ctype: str) -> bool:
    c = find_condition(wl, ctype)
    return c is not None and c.get("status") == ConditionStatus.TRUE


def quota_reserved(wl: Mapping[str, Any]) -> bool:
    return _true(wl, WorkloadCondition.QUOTA_RESERVED)


def finished(wl: Mapping[str, Any]) -> bool:
    return _true(wl, WorkloadCondition.FINISHED)


def _pod_set_template(worker: Mapping[str, Any]) -> dict[str, Any]:
    """What Kueue needs of a rendered worker pod: its containers' requests and the fields that
    decide where it may run (the environment and volumes stay out: they do not count)."""
    spec = worker["spec"]
    containers = [
        {k: c[k] for k in ("name", "image", "resources") if k in c} for c in spec["containers"]
    ]
    keep = ("nodeSelector", "tolerations", "affinity", "priorityClassName", "schedulerName")
    return {"spec": {"containers": containers, **{k: spec[k] for k in keep if spec.get(k)}}}


def pod_sets(job: DDPJob, worker: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One pod set of ``spec.nodes`` pods; an elastic job may be admitted with ``minNodes``
    (Kueue's partial admission)."""
    return [{"name": POD_SET, **_counts(job), "template": _pod_set_template(worker)}]


def _counts(job: DDPJob) -> dict[str, int]:
    """The pod set's ``count`` and, for an elastic job, ``minCount``."""
    s = job.spec
    if s.min_nodes is not None and s.min_nodes < s.nodes:
        return {"count": s.nodes, "minCount": s.min_nodes}
    return {"count": s.nodes}


def render_workload(
    job: DDPJob, worker: Mapping[str, Any], queue: str, priority: int | None, job_label: str
) -> dict[str, Any]:
    """The Workload of ``job`` (``worker``: its rendered node-0 pod; ``priority``: the value of
    its PriorityClass, which Kueue reads from the Workload)."""
    meta = job.metadata
    spec: dict[str, Any] = {"queueName": queue, "podSets": pod_sets(job, worker)}
    pcn = worker["spec"].get("priorityClassName")
    if pcn:
        spec["priorityClassRef"] = {
            "group": "scheduling.k8s.io",
            "kind": "PriorityClass",
            "name": pcn,
        }
        if priority is not None:
            spec["priority"] = priority
    return {
        "apiVersion": KUEUE_API,
        "kind": "Workload",
        "metadata": {
            "name": workload_name(job),
            "namespace": meta.get("namespace", "default"),
            "labels": {job_label: meta["name"], JOB_UID_LABEL: str(meta.get("uid", ""))},
            "ownerReferences": [owner_reference(meta)],
        },
        "spec": spec,
    }


def resize(job: DDPJob, wl: Mapping[str, Any]) -> dict[str, Any] | None:
    """A merge patch of the Workload's pod sets when ``spec.nodes`` changed while the job waits
    in the queue (Kueue refuses pod set changes while quota is reserved); else None."""
    want = [_counts(job)]
    have = (wl.get("spec") or {}).get("podSets") or []
    if quota_reserved(wl) or finished(wl) or not have:
        return None
    if [have[0].get(k) for k in ("count", "minCount")] == [
        want[0].get(k) for k in ("count", "minCount")
    ]:
        return None
    merged = [{**have[0], "count": want[0]["count"]}, *have[1:]]
    merged[0].pop("minCount", None)
    if "minCount" in want[0]:
        merged[0]["minCount"] = want[0]["minCount"]
    return {"spec": {"podSets": merged}}


def activation(job: DDPJob, wl: Mapping[str, Any]) -> dict[str, Any] | None:
    """A merge patch of the Workload's ``spec.active`` when it differs from ``not
    spec.suspend``: a suspended job gives its quota back (Kueue evicts an inactive Workload,
    reason Deactivated) and does not queue again until it is resumed; else None."""
    active = not job.spec.suspend
    if (wl.get("spec") or {}).get("active", True) == active or finished(wl):
        return None
    return {"spec": {"active": active}}


def admission(wl: Mapping[str, Any] | None, queue: str) -> Admission:
    """What Kueue decided, read from the Workload's conditions and ``status.admission``."""
    if wl is None:
        return Admission(
            State.QUEUED, queue, reason=WorkloadReason.PENDING, message="creating the Workload"
        )
    name = (wl.get("metadata") or {}).get("name", "")
    evicted = find_condition(wl, WorkloadCondition.EVICTED)
    if evicted is not None and evicted.get("status") == ConditionStatus.TRUE:
        return Admission(
            State.EVICTED,
            queue,
            name,
            reason=evicted.get("reason", ""),
            message=evicted.get("message", ""),
        )
    if _true(wl, WorkloadCondition.ADMITTED):
        adm = (wl.get("status") or {}).get("admission") or {}
        assignments = adm.get("podSetAssignments") or []
        mine: dict[str, Any] = next((a for a in assignments if a.get("name") == POD_SET), {})
        flavors = tuple(sorted(set((mine.get("flavors") or {}).values())))
        admitted = find_condition(wl, WorkloadCondition.ADMITTED) or {}
        return Admission(
            State.ADMITTED,
            queue,
            name,
            cluster_queue=str(adm.get("clusterQueue", "")),
            count=mine.get("count"),
            flavors=flavors,
            reason=admitted.get("reason", ""),
            message=admitted.get("message", ""),
        )
    reserved = find_condition(wl, WorkloadCondition.QUOTA_RESERVED) or {}
    return Admission(
        State.QUEUED,
        queue,
        name,
        reason=reserved.get("reason") or WorkloadReason.PENDING,
        message=reserved.get("message") or f"waiting for LocalQueue {queue} to admit it",
    )


def with_flavors(adm: Admission, flavors: Mapping[str, Mapping[str, Any]]) -> Admission:
    """``adm`` with the node labels and tolerations of its flavors (ResourceFlavor bodies)."""
    labels: dict[str, str] = {}
    tolerations: list[dict[str, Any]] = []
    for name in adm.flavors:
        spec = (flavors.get(name) or {}).get("spec") or {}
        labels.update(spec.get("nodeLabels") or {})
        tolerations += [dict(t) for t in spec.get("tolerations") or [] if t not in tolerations]
    return Admission(
        adm.state,
        adm.queue,
        adm.workload,
        adm.cluster_queue,
        adm.count,
        adm.flavors,
        adm.reason,
        adm.message,
        labels,
        tuple(tolerations),
    )


def admitted_job(job: DDPJob, adm: Admission) -> DDPJob:
    """The job as it runs under ``adm``: the flavors' node labels and tolerations added to its
    pods, and no more nodes than Kueue admitted."""
    s = job.spec
    nodes = s.nodes if adm.count is None else min(s.nodes, adm.count)
    if not adm.node_labels and not adm.tolerations and nodes == s.nodes:
        return job
    template = s.template.model_copy() if s.template is not None else None
    selector = {**((template.node_selector if template else None) or {}), **adm.node_labels}
    tolerations = [*((template.tolerations if template else None) or [])]
    tolerations += [t for t in adm.tolerations if t not in tolerations]
    template = (template or PodTemplateOverrides()).model_copy(
        update={"node_selector": selector or None, "tolerations": tolerations or None}
    )
    spec = s.model_copy(update={"nodes": nodes, "template": template})
    return job.model_copy(update={"spec": spec})


def _status_patch(wl: Mapping[str, Any], conditions: list[dict[str, Any]]) -> dict[str, Any]:
    """A server-side apply of the admission status as Kueue's PatchAdmissionStatus makes it:
    the object's identity (resourceVersion: a conflict if it changed), the admission (if any),
    the admission-managed conditions and the bookkeeping that goes with them."""
    meta, status = wl.get("metadata") or {}, wl.get("status") or {}
    out: dict[str, Any] = {"conditions": conditions}
    admission_ = status.get("admission")
    if admission_ is not None:
        out["admission"] = admission_
        out["resourceRequests"] = []
    elif status.get("resourceRequests"):
        out["resourceRequests"] = status["resourceRequests"]
    for key in ("requeueState", "accumulatedPastExecutionTimeSeconds", "clusterName"):
        if status.get(key) is not None:
            out[key] = status[key]
    evictions = (status.get("schedulingStats") or {}).get("evictions")
    if evictions:
        out["schedulingStats"] = {"evictions": evictions}
    return {
        "apiVersion": KUEUE_API,
        "kind": "Workload",
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "status": out,
    }


def _set(conds: dict[str, dict[str, Any]], new: dict[str, Any], now: str) -> None:
    """metav1 SetStatusCondition: lastTransitionTime moves only when the status flips."""
    old = conds.get(new["type"])
    new["lastTransitionTime"] = transition_time(old, new["status"], now)
    conds[new["type"]] = {**(old or {}), **new}


def _managed(wl: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    conds = {c["type"]: dict(c) for c in (wl.get("status") or {}).get("conditions") or []}
    return {t: conds[t] for t in ADMISSION_CONDITIONS if t in conds}


def release(wl: Mapping[str, Any], now: str) -> dict[str, Any] | None:
    """After an eviction, once the job's pods are gone: the apply that clears the admission
    (QuotaReserved=False "Pending", Admitted=False "NoReservation", Requeued) so that Kueue
    queues the Workload again; None when there is nothing to release."""
    evicted = find_condition(wl, WorkloadCondition.EVICTED)
    if evicted is None or evicted.get("status") != ConditionStatus.TRUE or not quota_reserved(wl):
        return None
    gen = (wl.get("metadata") or {}).get("generation")
    reason, message = evicted.get("reason", ""), evicted.get("message", "")
    conds = _managed(wl)
    requeued = ConditionStatus.TRUE if reason in REQUEUED_REASONS else ConditionStatus.FALSE
    _set(conds, _cond(WorkloadCondition.REQUEUED, requeued, reason, message, gen), now)
    _set(
        conds,
        _cond(
            WorkloadCondition.QUOTA_RESERVED,
            ConditionStatus.FALSE,
            WorkloadReason.PENDING,
            message,
            gen,
        ),
        now,
    )
    if (
        WorkloadCondition.ADMITTED in conds
        and conds[WorkloadCondition.ADMITTED].get("status") != ConditionStatus.FALSE
    ):
        _set(
            conds,
            _cond(
                WorkloadCondition.ADMITTED,
                ConditionStatus.FALSE,
                WorkloadReason.NO_RESERVATION,
                "The workload has no reservation",
                gen,
            ),
            now,
        )
    patch = _status_patch(wl, list(conds.values()))
    patch["status"].pop("admission", None)
    if patch["status"].get("resourceRequests") == []:
        patch["status"].pop("resourceRequests")
    return patch


def finish(wl: Mapping[str, Any], succeeded: bool, message: str, now: str) -> dict[str, Any] | None:
    """The apply that marks the Workload Finished (Succeeded or Failed); None if it is."""
    if finished(wl):
        return None
    gen = (wl.get("metadata") or {}).get("generation")
    conds = _managed(wl)
    reason = WorkloadReason.SUCCEEDED if succeeded else WorkloadReason.FAILED
    _set(conds, _cond(WorkloadCondition.FINISHED, ConditionStatus.TRUE, reason, message, gen), now)
    return _status_patch(wl, list(conds.values()))


def _cond(ctype: str, status: str, reason: str, message: str, gen: Any) -> dict[str, Any]:
    c = {"type": ctype, "status": status, "reason": reason, "message": message[:32768]}
    if gen is not None:
        c["observedGeneration"] = gen
    return c
