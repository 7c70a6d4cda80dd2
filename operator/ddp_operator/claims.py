"""Two live jobs on one checkpoint claim: pure, from the snapshots of kopf's job index.

A DDPJob's checkpoint folder is its whole ``spec.checkpoint.volume``. Two jobs that run on the
same claim write their checkpoints, manifest and run log into one folder, and each one's
retention (``spec.checkpoint.keep``) deletes the other's older files: with the same settings
the second resumes from the first's checkpoint and both go on writing; with others the trainer
refuses the resume (``IncompatibleResume``). Neither is what a user meant, and nothing in the
API forbids it (a claim is any volume source, and running jobs one after another on one claim
is how a run is resumed on purpose). So the operator does not refuse it: when it first starts a
job's pods while another job that has not finished uses the same claim, it says so in a Warning
Event (``CheckpointClaimShared``) naming that job and the fix."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ddp_api.ddpjob import TERMINAL_PHASES, DDPJobSpec


def volume_claim(volume: Mapping[str, Any]) -> str | None:
    """The claim a core/v1 volume source names; None for another kind of volume."""
    claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
    return str(claim) if claim else None


def claim_of(spec: Mapping[str, Any]) -> str | None:
    """The claim of a job's checkpoint volume (a spec as the API holds it); None without one."""
    return volume_claim((spec.get("checkpoint") or {}).get("volume") or {})


def job_claim(spec: DDPJobSpec) -> str | None:
    """:func:`claim_of` for a spec already read into the API's model."""
    return volume_claim(spec.checkpoint.volume) if spec.checkpoint else None


def sharing(
    namespace: str, name: str, claim: str | None, jobs: Iterable[Mapping[str, Any]]
) -> list[str]:
    """The other jobs of ``namespace`` that have not finished, are not suspended and check-
    point to ``claim``, by name; [] without a claim."""
    if not claim:
        return []
    others = []
    for job in jobs:
        meta, spec = job.get("metadata") or {}, job.get("spec") or {}
        if meta.get("namespace") != namespace or meta.get("name") == name:
            continue
        if (job.get("status") or {}).get("phase") in TERMINAL_PHASES or spec.get("suspend"):
            continue
        if claim_of(spec) == claim:
            others.append(str(meta.get("name")))
    return sorted(others)


def shared_message(claim: str, others: list[str]) -> str:
    """What the Warning Event says."""
    names = ", ".join(f"ddpjob/{n}" for n in others)
    return (
        f"spec.checkpoint.volume is claim {claim}, which {names} also checkpoints to while it"
        " has not finished: both write and prune one checkpoint folder (this job resumes from"
        " the other's checkpoint, or refuses it if its settings differ); give each job a claim"
        " of its own"
    )
