"""Why a job's pods cannot start or run, from what :func:`ddp_operator.planner.views.problem`
reads of their statuses: pure, like the planner that uses it. The kubelet's and the scheduler's reasons become one DDPJob reason, with a message
that names the pods, what is wrong (image, claim, command, capacity, memory) and the fix.

| pod status | DDPJob reason | outcome |
|---|---|---|
| waiting ErrImagePull, ImagePullBackOff, ErrImageNeverPull, InvalidImageName | ImagePullFailed | fails after startupDeadlineSeconds |
| PodScheduled False: ``persistentvolumeclaim "x" not found`` | ClaimNotFound | fails after startupDeadlineSeconds |
| waiting CreateContainerConfigError, CreateContainerError, RunContainerError | ContainerConfigError | fails after startupDeadlineSeconds |
| terminated StartError/ContainerCannotRun (or waiting as above) that could not exec the command; exit 126/127 | CommandNotFound | fails at once |
| PodScheduled False, any other message (cpu, memory, taint, selector, unbound claim) | Unschedulable | waits (an autoscaler may add a machine) |
| terminated OOMKilled | OOMKilled | a pod failure: spends backoffLimit |
| terminated Error, exit 137, a memory limit | (PodFailed) | a pod failure; :func:`killed_hint` names the limit |
| terminated, termination message ``IncompatibleResume: ...`` (the trainer's) | IncompatibleResume | fails at once |
| terminated, termination message ``SyntaxError: ...`` (IndentationError, TabError: the node wrapper's) | SyntaxError | fails at once |
| terminated, exit 1-127, any other termination message | (PodFailed) | a pod failure; :func:`said` quotes it |
"""  # noqa: E501

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from ddp_api.contract import one_line, parse_rfc3339
from ddp_api.ddpjob import DDPJobSpec, ProblemReason
from ddp_api.pods import IMAGE_PULL_REASONS

from . import claims, render
from .planner.views import (
    COMMAND_EXIT_CODES,
    CONFIG_REASONS,
    CRASH_LOOP,
    OOM,
    START_REASONS,
    PodView,
)

# Reasons of failures that are counted like any other, named while the job restarts.
COUNTED_REASONS = frozenset({OOM, *START_REASONS})
WAITS_SAID_AFTER_S = 10.0  # pod age before Unschedulable is said (it is often a moment's)
SIGKILL_EXIT_CODE = 137  # 128 + SIGKILL: what a process the kernel's OOM killer ended exits with
# How runc and crun say that the program to run is missing or cannot be run (not found, no
# such file, permission denied, exec format error), naming it; a mount's or a cgroup's trouble
# is no missing command.
_COMMAND_FAILED = re.compile(
    r'exec: "(?P<exec>[^"]+)"|"(?P<path>[^"]+)": executable file not found|exec format error'
)
_CLAIM_MISSING = re.compile(r'persistentvolumeclaim "([^"]+)" not found')


class Effect(StrEnum):
    """What a problem does to the job."""

    FAILS = "fails"  # at once: retrying cannot help
    DEADLINE = "deadline"  # once a pod showing it is older than spec.startupDeadlineSeconds
    WAITS = "waits"  # never by itself: it may heal (activeDeadlineSeconds still applies)
    COUNTED = "counted"  # a failed pod like any other: recreated, spending backoffLimit


@dataclass(frozen=True)
class Finding:
    """One pod's problem, as the DDPJob says it."""

    reason: str  # the DDPJob's condition reason
    culprit: str  # what is wrong, as it is named in the message
    outcome: Effect
    detail: str  # the kubelet's, runtime's or scheduler's own words


def memory_limit(spec: DDPJobSpec) -> str:
    limits = (spec.resources.limits if spec.resources else None) or {}
    return str(limits["memory"]) if "memory" in limits else "unset"


SAID_MAX_CHARS = 512  # of a termination message quoted in an Event or a condition


def said(pod: PodView) -> str:
    """``: <why>`` from a failed worker's termination message, for the failure's report; "" when
    it has none, or ended by a signal (128+: the message would be an earlier failure's)."""
    code = pod.exit_code
    if not pod.said.strip() or code is None or not 1 <= code <= 127:
        return ""
    return f": {one_line(pod.said, SAID_MAX_CHARS)}"


def checkpoint_volume(spec: DDPJobSpec) -> str:
    """The checkpoint volume as a user named it: its claim, else the field."""
    claim = claims.job_claim(spec)
    return f"claim {claim}" if claim else "spec.checkpoint.volume"


def killed_hint(pod: PodView, spec: DDPJobSpec) -> str:
    """What a node pod's exit code 137 (SIGKILL) may mean when its runtime did not say
    OOMKilled: containerd can publish a container's exit before the kernel's OOM event
    (containerd#12260, #12372), and the kubelet then reports reason Error. The memory limit is
    named as the likely cause, not as a diagnosis; "" for other pods and codes, or no limit."""
    limit = memory_limit(spec)
    if pod.exit_code != SIGKILL_EXIT_CODE or limit == "unset" or pod.role != render.ROLE_WORKER:
        return ""
    return (
        f" (SIGKILL, as the kernel's OOM killer sends it when a container passes"
        f" spec.resources.limits.memory, now {limit}; if its memory grew to that, raise it)"
    )


def _command_of(message: str, spec: DDPJobSpec, exit_code: int | None) -> str:
    """The command as the runtime reported it, else as the spec has it."""
    named = _COMMAND_FAILED.search(message)
    if named and (named["exec"] or named["path"]):
        return str(named["exec"] or named["path"])
    if spec.command:
        return spec.command[0]
    return "the bundled trainer" if exit_code is None else f"the command (exit code {exit_code})"


def finding(pod: PodView, spec: DDPJobSpec) -> Finding | None:
    """What ``pod``'s problem means for the job; None when it shows none."""
    p = pod.problem
    if p is None:
        return None
    image = p.image or spec.image or "the image"
    if p.reason in IMAGE_PULL_REASONS:
        return Finding(ProblemReason.IMAGE_PULL_FAILED, image, Effect.DEADLINE, p.message)
    start = p.reason in START_REASONS or p.reason in ("CreateContainerError", "RunContainerError")
    if (start and _COMMAND_FAILED.search(p.message)) or pod.exit_code in COMMAND_EXIT_CODES:
        command = _command_of(p.message, spec, pod.exit_code)
        return Finding(ProblemReason.COMMAND_NOT_FOUND, command, Effect.FAILS, p.message)
    if p.reason in CONFIG_REASONS:
        return Finding(ProblemReason.CONTAINER_CONFIG_ERROR, p.reason, Effect.DEADLINE, p.message)
    if p.reason == OOM:
        return Finding(ProblemReason.OOM_KILLED, memory_limit(spec), Effect.COUNTED, p.message)
    if p.reason == ProblemReason.INCOMPATIBLE_RESUME:
        return Finding(p.reason, checkpoint_volume(spec), Effect.FAILS, p.message)
    if p.reason == ProblemReason.SYNTAX_ERROR:
        return Finding(p.reason, p.reason, Effect.FAILS, p.message)
    if p.reason == CRASH_LOOP:  # a server (only they restart in place); it may yet come back
        return Finding(ProblemReason.SERVER_FAILING, p.reason, Effect.WAITS, p.message)
    if p.reason in START_REASONS:
        return Finding(p.reason, p.reason, Effect.COUNTED, p.message)
    if not p.scheduler:
        return None
    claim = _CLAIM_MISSING.search(p.message)
    if claim:
        return Finding(ProblemReason.CLAIM_NOT_FOUND, claim.group(1), Effect.DEADLINE, p.message)
    return Finding(ProblemReason.UNSCHEDULABLE, p.reason, Effect.WAITS, p.message)


# The job's server pods as messages name them, and what each runs from the job's image.
SERVERS = {
    render.ROLE_STORE: ("the store", "python3 with torch (the rendezvous store)"),
    render.ROLE_LIGHTHOUSE: ("the lighthouse", "torchft_lighthouse (pip install torchft)"),
}


def in_order(pods: Iterable[PodView]) -> list[PodView]:
    """Node pods by index, the server last: the order in which messages name pods."""
    return sorted(pods, key=lambda x: (x.role in SERVERS, x.index))


def pod_names(pods: Iterable[PodView]) -> str:
    """``j-node-0, j-node-1 and the store j-rdzv``: node pods by index, the server last."""
    pods = in_order(pods)
    names = [f"{SERVERS[x.role][0]} {x.name}" if x.role in SERVERS else x.name for x in pods]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def message(f: Finding, pods: Iterable[PodView]) -> str:
    """What the condition and the Event say: the pods, the culprit, the fix."""
    pods = list(pods)
    who, why = pod_names(pods), f.detail
    if f.reason == ProblemReason.IMAGE_PULL_FAILED:
        return (
            f"{who} cannot pull image {f.culprit}: {why}; check spec.image (and"
            " spec.template.imagePullSecrets for a private registry)"
        )
    if f.reason == ProblemReason.CLAIM_NOT_FOUND:
        return (
            f"{who} cannot be scheduled: persistentvolumeclaim {f.culprit!r} not found; create"
            " it in the job's namespace, or fix spec.checkpoint.volume or spec.template.volumes"
        )
    if f.reason == ProblemReason.CONTAINER_CONFIG_ERROR:
        return (
            f"{who} cannot create the container ({f.culprit}): {why}; fix spec.template (env,"
            " volumes, volumeMounts) or create what it names"
        )
    runs = ", ".join(sorted({SERVERS[x.role][1] for x in pods if x.role in SERVERS}))
    if f.reason == ProblemReason.COMMAND_NOT_FOUND:
        if runs:  # the operator chose the command; only the image can give it
            return (
                f"{who} cannot run {f.culprit}: {why}; it runs {runs} from the job's image: use"
                " a spec.image that has it"
            )
        return f"{who} cannot run {f.culprit}: {why}; fix spec.command, or use an image that has it"
    if f.reason == ProblemReason.SERVER_FAILING:
        logs = " ".join(f"kubectl logs {x.name} --previous" for x in pods)
        return (
            f"{who} keeps failing ({why}), restarted with a back-off; it runs {runs} from the"
            f" job's image: check that spec.image has it ({logs})"
        )
    if f.reason == ProblemReason.INCOMPATIBLE_RESUME:
        why = why.removeprefix("cannot resume: ")
        return (
            f"{who} cannot resume from the checkpoint on {f.culprit}: {why} (a DDPJob's"
            " checkpoint folder is its spec.checkpoint.volume: give it a claim of its own)"
        )
    if f.reason == ProblemReason.SYNTAX_ERROR:
        return (
            f"{who} cannot run the program: it does not compile: {why}; fix it and run the job"
            " again (no restart can)"
        )
    if f.reason == ProblemReason.OOM_KILLED:
        return f"OOMKilled: raise spec.resources.limits.memory (now {f.culprit})"
    if f.reason == ProblemReason.UNSCHEDULABLE:
        return (
            f"no machine can take {who} yet ({f.culprit}): {why}; waiting for one (a cluster"
            " autoscaler may add it); or lower spec.resources.requests, or fix"
            " spec.template.nodeSelector, tolerations or affinity"
        )
    return f"{who} could not start ({f.reason}): {why}"


@dataclass(frozen=True)
class Diagnosis:
    """The job's one problem to show: its reason, message, and when it fails the job."""

    reason: str
    said: str  # what is wrong and the fix
    fails_in: float | None  # seconds until it fails the job (<= 0: now); None: it waits
    deadline: int | None = None  # spec.startupDeadlineSeconds, for a problem that waits for it

    @property
    def message(self) -> str:
        """While the job waits."""
        if self.deadline is None:
            return self.said
        return (
            f"{self.said}; the job fails if a pod still shows this {self.deadline}s after its"
            " creation (spec.startupDeadlineSeconds)"
        )

    @property
    def failed(self) -> str:
        """When it fails the job."""
        if self.deadline is None:
            return self.said
        return f"{self.said}; failed: it lasted past spec.startupDeadlineSeconds ({self.deadline}s)"


_RANK = {Effect.FAILS: 0, Effect.DEADLINE: 1, Effect.WAITS: 2}


def _age(pod: PodView, now: dt.datetime) -> float | None:
    created = parse_rfc3339(pod.created)
    return None if created is None else (now - created).total_seconds()


def _settling(f: Finding, pod: PodView, now: dt.datetime) -> bool:
    """A pod too young to call unschedulable: a claim made by the same `kubectl apply` is
    unbound for a moment, and the scheduler says so."""
    age = _age(pod, now)
    return f.outcome == Effect.WAITS and age is not None and age < WAITS_SAID_AFTER_S


def diagnose(pods: Iterable[PodView], spec: DDPJobSpec, now: dt.datetime) -> Diagnosis | None:
    """The most serious problem that live pods show (what fails the job first), with every pod
    that shows the same; None when they show none. Failed pods are the planner's to count."""
    groups: dict[tuple[str, str, Effect], tuple[Finding, list[PodView]]] = {}
    for x in pods:
        f = finding(x, spec)
        if f is not None and f.outcome != Effect.COUNTED and not _settling(f, x, now):
            # Pods with the same problem group together, whatever their kubelet's words.
            groups.setdefault((f.reason, f.culprit, f.outcome), (f, []))[1].append(x)
    if not groups:
        return None
    first, shown = min(groups.values(), key=lambda g: (_RANK[g[0].outcome], g[0].reason))
    said = message(first, shown)
    if first.outcome == Effect.WAITS:
        return Diagnosis(first.reason, said, None)
    if first.outcome == Effect.FAILS:
        return Diagnosis(first.reason, said, 0.0)
    deadline = spec.startup_deadline_seconds
    age = max((a for a in (_age(x, now) for x in shown) if a is not None), default=0.0)
    return Diagnosis(first.reason, said, deadline - age, deadline)


def settled_in(pods: Iterable[PodView], spec: DDPJobSpec, now: dt.datetime) -> float | None:
    """Seconds until a pod that :func:`diagnose` leaves unsaid for its youth may be said."""
    waits = [
        WAITS_SAID_AFTER_S - (_age(x, now) or 0.0)
        for x in pods
        if (f := finding(x, spec)) is not None and _settling(f, x, now)
    ]
    return min(waits, default=None)
