"""The pure decisions of per-step fault tolerance (:mod:`ddp_trainer.per_step.trainer`): a pod's
place as a replica group from its environment, each participant's share of a step's global batch,
when a group loads a checkpoint instead of healing from a live peer, and the quorum ids given to
torchft. No I/O, no torchft here."""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ddp_api.contract import (
    ENV_FAULT_TOLERANCE,
    ENV_GROUP_TIMEOUT,
    ENV_GROUPS,
    ENV_JOB_NAME,
    ENV_LIGHTHOUSE,
    ENV_MIN_GROUPS,
    ENV_POD_IP,
    ENV_REPLICA_GROUP,
    FAULT_TOLERANCE_PER_STEP,
    quorum_timeout_s,
)
from ddp_trainer.data.batching import micro_sizes

DEFAULT_GROUP_TIMEOUT_S = 30.0


def per_step(environ: Mapping[str, str]) -> bool:
    """Whether this pod runs in PerStep mode (``DDPJOB_FAULT_TOLERANCE=PerStep``)."""
    return environ.get(ENV_FAULT_TOLERANCE) == FAULT_TOLERANCE_PER_STEP


def run_id(environ: Mapping[str, str]) -> str:
    """The id the completion record names in PerStep mode, which torchrun's standalone
    rendezvous does not give (its TORCHELASTIC_RUN_ID is random per start): ``PET_RDZV_ID``
    (the DDPJob's uid, as in Restart mode) when set, else the job's name."""
    return environ.get("PET_RDZV_ID") or environ.get(ENV_JOB_NAME) or ""


def url_host(host: str) -> str:
    """``host`` as a URL or ``host:port`` writes it (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


@dataclass(frozen=True)
class GroupSettings:
    """This pod's place among the replica groups, from the operator's environment."""

    lighthouse: str  # TORCHFT_LIGHTHOUSE: http://host:port
    group: int  # REPLICA_GROUP_ID: the pod's node index
    replica_id: str  # the lighthouse's name of the group: <job>-<group> (torchft adds a uuid)
    groups_hint: int  # NUM_REPLICA_GROUPS: spec.nodes when the pod was made
    min_groups: int  # DDPJOB_MIN_GROUPS: the fewest groups whose step may be committed
    timeout_s: float  # DDPJOB_GROUP_TIMEOUT_S: collectives, commit votes, heal transfers
    host: str  # where peers reach this pod (its IP: pod hostnames may not resolve)

    @property
    def quorum_timeout_s(self) -> float:
        """How long one try at a quorum waits (:func:`ddp_api.contract.quorum_timeout_s`)."""
        return quorum_timeout_s(self.timeout_s)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> GroupSettings:
        """Raises ValueError naming the variable when one is missing or not a number."""
        lighthouse = environ.get(ENV_LIGHTHOUSE)
        if not lighthouse:
            raise ValueError(f"{ENV_LIGHTHOUSE} is not set: PerStep mode needs a lighthouse")
        group = _index(environ, ENV_REPLICA_GROUP)
        job = environ.get(ENV_JOB_NAME) or "ddpjob"
        return cls(
            lighthouse=lighthouse,
            group=group,
            replica_id=f"{job}-{group}",
            groups_hint=int(_number(environ, ENV_GROUPS, 1)),
            min_groups=int(_number(environ, ENV_MIN_GROUPS, 1)),
            timeout_s=_number(environ, ENV_GROUP_TIMEOUT, DEFAULT_GROUP_TIMEOUT_S),
            host=environ.get(ENV_POD_IP) or environ.get("PET_LOCAL_ADDR") or socket.gethostname(),
        )


def _number(environ: Mapping[str, str], name: str, default: float | None) -> float:
    """A positive number from ``name`` (``default`` when unset; None: it must be set)."""
    text = environ.get(name)
    if not text:
        if default is None:
            raise ValueError(f"{name} is not set: PerStep mode needs it")
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a number") from None
    if value <= 0:
        raise ValueError(f"{name}={text!r} must be positive")
    return value


def _index(environ: Mapping[str, str], name: str) -> int:
    """A whole number of at least 0 from ``name``, which must be set."""
    text = environ.get(name, "")
    if not text.isdigit():
        raise ValueError(f"{name}={text!r} must be set to a whole number (the pod's node index)")
    return int(text)


def participant_share(
    global_batch: int, groups: int, group_rank: int | None, nproc: int, local_rank: int
) -> tuple[int, int]:
    """(start, count) of one process's contiguous share of a step's global batch: the step's
    participating groups (``groups`` of them, this one at ``group_rank``; None: not
    participating, no share) each with ``nproc`` local ranks split it by the flat rank
    ``group_rank * nproc + local_rank``, shares differing by at most one sample (some may be
    empty when the global batch is smaller than the processes)."""
    if group_rank is None:
        return 0, 0
    world = groups * nproc
    rank = group_rank * nproc + local_rank
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside {groups} groups of {nproc}")
    base, extra = divmod(global_batch, world)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)


def micro_split(count: int, cap: int) -> tuple[int, ...]:
    """A share of ``count`` samples in micro-batches of at most ``cap`` (none when empty)."""
    if count == 0:
        return ()
    return micro_sizes(count, -(-count // cap))


def whole_batch(samples: float, global_batch: int) -> bool:
    """Whether the all-reduced sample count of a step is its whole global batch: every
    participant's share is in the sum, none twice (a committed step must pass this)."""
    return round(samples) == global_batch


def share_weights(terms: Sequence[int]) -> list[float]:
    """The backward weight of each micro-batch's mean loss in a share of ``terms`` loss terms per
    micro-batch: ``n / T`` over the share's ``T`` terms, so the share's gradient is that of its
    mean loss, as large as a Restart rank's (with fp16, a backward ``T`` times larger overflows
    the GradScaler's scale where Restart mode's does not, and those steps are skipped). Times
    ``mean_divisor(T)`` it is the sum of (mean loss x terms) gradients that the groups add up,
    whatever each share's size (:func:`mean_divisor`)."""
    total = sum(terms)
    return [n / total if total else 0.0 for n in terms]


def mean_divisor(terms: float) -> float:
    """What the all-reduced sum of (each micro-batch's mean loss x its loss terms) gradients
    is divided by to be the gradient of the whole global batch's mean loss: its loss terms
    (samples, or tokens), at least one (a batch of padding only gives zeros, not NaN)."""
    return max(float(terms), 1.0)


def loads_checkpoint(first_quorum_max_step: int) -> bool:
    """Whether a group loads the newest checkpoint: only when the first quorum it joined has
    no group that has trained a step (max step 0: a new job, or every group was lost); any
    live group at a later step is healed from instead, so the volume is read only then."""
    return first_quorum_max_step == 0


def trained_elsewhere(
    beats: Mapping[int, tuple[int, float]], group: int, now: float, window_s: float
) -> tuple[int, float] | None:
    """A first quorum at max step 0 means "every group was lost" only when no other group that
    has trained a step beat within ``window_s`` (:mod:`ddp_trainer.per_step.beats`); returns
    that group's (steps, seconds since its beat) when one did (the newest step), else None.
    This group's own index is left out: its beats are its lost incarnation's."""
    live = [
        (step, now - at)
        for index, (step, at) in beats.items()
        if index != group and step > 0 and now - at <= window_s
    ]
    return max(live, default=None)


def beat_window_s(group_timeout_s: float) -> float:
    """How recent a group's beat must be for it to count as alive: twice the group timeout (the
    lighthouse's heartbeat timeout), at least 5 s, for clocks of machines that differ a little."""
    return max(5.0, 2 * group_timeout_s)


class QuorumIds:
    """The quorum id this process gives torchft's Manager for each quorum: unique for the job's
    life, where the lighthouse's own ids are unique only for the lighthouse's.

    torchft's Manager rebuilds its cross-group process group when a quorum's id differs from
    the last one, at the store prefix ``/torchft/<id>/``, and needs that prefix new each time. A
    lighthouse that is replaced numbers its quorums from 1 again, so a group could meet a prefix
    an earlier quorum wrote (the gloo addresses of processes long gone) and time out connecting
    to them: seen on loopback, all three groups stalled 25-32 s after a new lighthouse's quorums
    (``tests/trainer/test_trainer_per_step.py -k new_lighthouse``). Or a new quorum with
    other members but the id this process last had would not rebuild the group at all.

    Here a quorum is known by its lighthouse id and its members (torchft's replica ids, a uuid
    per incarnation of a group). When that changes, the id becomes: the step the quorum formed
    at (``max_step``), then the lighthouse's id (its low 8 bits), then 24 bits of a hash of the
    members, so that a later quorum has a higher id (the sample log's order of tries) and no two
    quorums of a job share one. The members of a new quorum receive it in the same answer of
    the lighthouse, with the same ``max_step``, and compute the same id. One exception: a member
    whose last quorum had the same lighthouse id and members (a new lighthouse's quorums reached
    that id again while it did not ask) would keep its old id. A member whose quorum failed (it
    asked while the lighthouse was away) forgets its last quorum (:meth:`forget`); one that never
    noticed fails the step with the others, and the lighthouse gives the quorum after a failed
    commit a new id (torchft's lighthouse does so on any member's commit failure)."""

    def __init__(self) -> None:
        self._key: tuple[int, tuple[str, ...]] | None = None
        self._id = -1

    def id_for(self, quorum_id: int, replica_ids: Sequence[str], max_step: int) -> int:
        key = (quorum_id, tuple(sorted(replica_ids)))
        if key != self._key:
            self._key = key
            members = int.from_bytes(hashlib.sha256(repr(key).encode()).digest()[:3], "big")
            self._id = (max_step << 32) | ((quorum_id & 0xFF) << 24) | members
        return self._id

    def forget(self) -> None:
        """After a failed quorum: the next quorum is a new one to this process."""
        self._key = None
