"""This process's side of torchft in PerStep mode (see :mod:`ddp_trainer.per_step.trainer`): its
``Manager`` (quorums, heals over torchft's HTTP checkpoint transport, the commit vote), the
cross-group process group, and a step's gradients summed over every participant: each local
rank's share -> a sum over the group's local ranks (default process group) -> local rank r sums
chunk r of that vector across the groups (``Manager.allreduce``) -> the chunks are gathered
back inside the group."""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections.abc import Callable, MutableMapping
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

from ddp_trainer.distributed import DistEnv
from ddp_trainer.parts import Parts
from ddp_trainer.per_step.replicas import (
    GroupSettings,
    QuorumIds,
    mean_divisor,
    url_host,
    whole_batch,
)
from ddp_trainer.state.train_state import scatter

log = logging.getLogger("ddp_trainer.trainer")  # the trainer's lines: people and tests grep them

# torch warns, at every heal, that the tensors torchft's transport reads over a read-only
# buffer could write into it; _load_from_peer copies them before any is kept (owned), so none
# does, and the warning would only alarm whoever reads the log.
warnings.filterwarnings("ignore", "The given buffer is not writable", UserWarning)


def owned(value: Any) -> Any:
    """``value`` with every tensor in its dicts, lists and tuples copied into memory of its own."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: owned(v) for k, v in value.items()}
    if type(value) in (list, tuple):  # plain ones: a named tuple's fields are not a sequence
        return type(value)(owned(v) for v in value)
    return value


QUORUM_RETRIES = 10  # the manager server's own tries at the lighthouse within one quorum


class Tail:
    """Indices of the counters at the end of the all-reduced vector (after the gradients)."""

    SAMPLES, TERMS, LOSS, STOP = range(-4, 0)


def _transport(host: str, timeout: timedelta) -> Any:
    """torchft's HTTP checkpoint transport, advertising ``host`` (the pod IP) instead of the
    hostname, which peers may not resolve."""
    from torchft.checkpointing import HTTPTransport

    class PodHTTPTransport(HTTPTransport):
        def address(self) -> str:
            port = self._server.socket.getsockname()[1]
            return f"http://{url_host(host)}:{port}/checkpoint/"

    return PodHTTPTransport(timeout=timeout, num_chunks=0)


def _cross_group_pg(device: torch.device, timeout: timedelta) -> Any:
    """The cross-group process group: NCCL on CUDA (aborted on a lost peer), else gloo.

    On CUDA, torchft aborts and rebuilds the group's communicator when a peer is lost; torch's
    NCCL watchdog must leave that error to it. By default (``TORCH_NCCL_ASYNC_ERROR_HANDLING``
    3) the watchdog ends the whole process about a minute after a peer's loss: seen on an H100,
    a survivor's worker aborted (SIGABRT) 60 s after its peer group was SIGKILLed, though
    torchft had already redone the step. The setting is read by each NCCL process group as it is
    made, so torchrun's local group (made before, by ``init_distributed``) still ends the
    process on a local rank's failure; only the groups torchft makes from here on are left to
    torchft (0: the watchdog does not act on their errors).

    What else a lost peer costs on CUDA is turned off before any group is made
    (:func:`no_nccl_dumps`)."""
    from torchft.process_group import ProcessGroupGloo, ProcessGroupNCCL

    if device.type == "cuda":
        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
        # torchft's own timeout of a non-blocking NCCL call (it warns when it sets it itself)
        os.environ.setdefault("TORCH_NCCL_NONBLOCKING_TIMEOUT", str(timeout.total_seconds()))
        return ProcessGroupNCCL(timeout=timeout)
    return ProcessGroupGloo(timeout=timeout)


# A PerStep process's defaults for torch's NCCL watchdogs (a pod's spec.template.env may set
# its own): no flight-recorder dump when a collective fails, and no wait for one.
NO_NCCL_DUMPS = {"TORCH_NCCL_DUMP_ON_TIMEOUT": "0", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "0"}


def no_nccl_dumps(environ: MutableMapping[str, str]) -> None:
    """Before this process makes any NCCL group (torchrun's local one first): a lost peer is
    routine in PerStep mode, not a bug to dump the flight recorder for. When a collective
    fails, torch's NCCL watchdog (as read in its source) signals every group of the process to
    dump it and waits for the dumps (``TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC``, 15 s, times
    four): seen on an H100, a survivor's next step came 60.2 s after its peer's loss, after
    the watchdog's "dump signal", with the dump already off for torchft's groups alone. The
    process's first group
    (torchrun's) watches for that signal too, and its heartbeat monitor may end the process
    (``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC``) or hold its teardown, which is a candidate cause of
    that run's worker that did not exit after the last step. Both are off before that group is
    made. Not yet seen on a GPU (tests/trainer/cuda_paths.py); gloo reads neither."""
    for name, value in NO_NCCL_DUMPS.items():
        environ.setdefault(name, value)


class JobQuorumIds:
    """torchft's ``ManagerClient`` (a Manager's ``_client``) whose quorums carry ids unique for
    the job's life (:class:`~ddp_trainer.per_step.replicas.QuorumIds`), not the lighthouse's;
    all else passes through. torchft 0.2.0's Manager reads a quorum's fields by name only."""

    def __init__(self, client: Any) -> None:
        self._client, self._ids = client, QuorumIds()
        self.last: Any = None  # the last quorum's answer, as the Manager got it

    def forget(self) -> None:
        self._ids.forget()

    def _quorum(self, **kwargs: Any) -> Any:
        quorum = self._client._quorum(**kwargs)
        fields = {name: getattr(quorum, name) for name in dir(quorum) if not name.startswith("_")}
        fields["quorum_id"] = self._ids.id_for(
            quorum.quorum_id, quorum.replica_ids, quorum.max_step
        )
        self.last = SimpleNamespace(**fields)
        return self.last

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


# torchft's loggers: its modules' ("torchft.*"), and three whose INFO records carry their fields
# in ``extra`` for its OpenTelemetry export and print as empty lines (a commit's, every step).
TORCHFT_LOGGERS = ("torchft", "torchft_quorums", "torchft_commits", "torchft_errors")


# torchft's loggers whose errors at a peer's loss come with a traceback: "got exception in pg
# configure" (and in all reduce, recovery, waiting for work), a heal's source that timed out.
TORCHFT_PEER_ERRORS = ("torchft.manager", "torchft.checkpointing.http_transport")


class OneLine(logging.Filter):
    """torchft's errors as one warning line each, without their traceback: a lost peer makes
    each survivor log an ERROR and a traceback of 5 to 12 lines for the step it could not
    finish, though nothing is wrong with the survivor; this module's own line (a step not
    committed, a quorum that failed) says what happened and what it does about it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.ERROR:
            record.msg, record.args = one_line(record.getMessage()), ()
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info, record.exc_text = None, None
        return True


def one_line(text: object) -> str:
    """The first line of an error's text (torchft's errors carry their traceback), at most 300
    characters."""
    lines = str(text).splitlines()
    return lines[0][:300] if lines else ""


def quiet_torchft() -> None:
    """torchft logs several lines per step at INFO (its Rust side reads RUST_LOG when it is
    first imported) and a traceback for every error a lost peer causes: warnings only (the
    Rust side's unless RUST_LOG says otherwise), each error on one line (:class:`OneLine`).
    This module's own lines say what matters (quorums that fail, heals, steps redone)."""
    os.environ.setdefault("RUST_LOG", "warn")
    for name in TORCHFT_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for name in TORCHFT_PEER_ERRORS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, OneLine) for f in logger.filters):
            logger.addFilter(OneLine())


class ReplicaGroup:
    """This process's torchft Manager and what goes through it (see the module docstring)."""

    def __init__(
        self,
        settings: GroupSettings,
        env: DistEnv,
        parts: Parts,
        distributed: bool,
        phase: Callable[[str], None],
    ):
        self.settings, self.env, self.distributed = settings, env, distributed
        self.parts, self.device = parts, parts.device
        self.phase = phase  # the test hook at each phase (ddp_trainer.per_step.hooks.StopAt)
        self.manager: Any = None
        self.quorum_ids: JobQuorumIds | None = None
        self.healed_from: str | None = None  # the last heal: "step N from <address>"
        self.errored = False  # the last quorum left an error on a local rank (a failed heal)
        self._state_dict: Callable[[], dict[str, Any]] = dict
        self._healed: Callable[[dict[str, Any]], None] = lambda state: None

    def start(
        self,
        state_dict: Callable[[], dict[str, Any]],
        healed: Callable[[dict[str, Any]], None],
    ) -> None:
        """Starts this process's torchft Manager: a heal loads a live peer's state into the
        parts and passes it to ``healed`` (the trainer's own counters), and a peer that heals
        from this group gets ``state_dict()`` (a checkpoint's contents)."""
        self._state_dict, self._healed = state_dict, healed
        from torchft import Manager

        g, e = self.settings, self.env
        timeout = timedelta(seconds=g.timeout_s)
        self.manager = Manager(
            pg=_cross_group_pg(self.device, timeout),
            load_state_dict=self._load_from_peer,
            state_dict=self._state_for_peer,
            min_replica_size=g.min_groups,
            use_async_quorum=False,
            timeout=timeout,
            quorum_timeout=timedelta(seconds=g.quorum_timeout_s),
            connect_timeout=timeout,
            rank=e.local_rank,
            world_size=e.world_size,
            store_addr=g.host,  # torchrun's store, as the other groups reach it
            store_port=int(os.environ["MASTER_PORT"]),
            lighthouse_addr=g.lighthouse,
            replica_id=g.replica_id,
            hostname=url_host(g.host),
            checkpoint_transport=_transport(g.host, timeout),
            init_sync=False,  # every group builds the same weights from the seed
            quorum_retries=QUORUM_RETRIES,
        )
        self.quorum_ids = JobQuorumIds(self.manager._client)
        self.manager._client = self.quorum_ids
        log.info(
            "replica group %s (local rank %d of %d, pid %d): lighthouse %s, at least %d groups, "
            "group timeout %gs",
            g.replica_id,
            e.local_rank,
            e.world_size,
            os.getpid(),
            g.lighthouse,
            g.min_groups,
            g.timeout_s,
        )

    def close(self) -> None:
        """Stops the Manager (its quorum thread, checkpoint server and manager server) and
        aborts the cross-group process group. torchft's ``Manager.shutdown`` leaves that group
        to the garbage collector, and an NCCL communicator's orderly teardown may wait on peers
        that are gone; an abort waits on none. Called once training has ended here, so no
        collective of this process is left to finish."""
        if self.manager is None:
            return
        self.manager.shutdown(wait=False)
        try:
            self.manager._pg.abort(errored=False)
        except Exception as error:  # the process exits next either way
            log.warning("aborting the cross-group process group failed: %s", error)

    def _state_for_peer(self) -> dict[str, Any]:
        """What a healing peer loads (torchft calls it when a peer heals from this group)."""
        self.phase("serve")
        return self._state_dict()

    def _load_from_peer(self, state: dict[str, Any]) -> None:
        """Loads a live peer's state (torchft calls it, in the main thread, while healing). Its
        tensors are copied first: torchft's transport reads them over the read-only buffer it
        received, and an optimizer keeps the tensors it loads, which training writes into."""
        self.phase("heal")
        scatter(owned(state), self.parts.stateful())
        self._healed(state)
        self.healed_from = f"step {state['step']}"
        log.info(
            "healed from a live peer: step %d (no checkpoint loaded)",
            self.parts.state.position.step,
        )

    def quorum(self) -> bool:
        """One quorum (healing this group if it is behind); False when it failed: the
        lighthouse is away, too few groups, a peer vanished while it formed. The group's local
        ranks agree on it (:meth:`_agree`); ``errored`` then says whether any of them holds an
        error from it (a heal that failed)."""
        ok = self._start_quorum()
        errored = ok and self.manager.errored() is not None
        if not self.distributed:
            self.errored = errored
            return ok
        return self._agree(ok, errored)

    def _agree(self, ok: bool, errored: bool) -> bool:
        """The local ranks' one answer to a quorum: each heals on its own (from its peer rank
        of a live group), so they can come out of one differently, and each then steps alone
        (one trains, one asks for a quorum again: both wait on the other until the local
        process group times out). Failed if it failed on any rank; errored if any rank holds an
        error. Ranks at different steps (a heal that completed on some ranks only: its source
        was lost mid-transfer) cannot go on as one group: that is a local failure, and the
        group starts again (torchrun's worker restart, else the pod's replacement), healing
        every rank anew."""
        step = float(self.manager.current_step()) if ok else 0.0
        said = torch.tensor([float(not ok), float(errored), step, -step], device=self.device)
        dist.all_reduce(said, op=dist.ReduceOp.MAX)
        failed, self.errored = bool(said[0]), bool(said[1])
        if failed:
            return False
        high, low = int(said[2]), -int(said[3])
        if high != low:
            raise RuntimeError(
                f"the local ranks of replica group {self.settings.replica_id} came out of one"
                f" quorum at different steps ({low} to {high}; a heal failed on some ranks):"
                " the group starts again"
            )
        return True

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any of the group's local ranks (all of them call this)."""
        if not self.distributed:
            return flag
        said = torch.tensor([float(flag)], device=self.device)
        dist.all_reduce(said, op=dist.ReduceOp.MAX)
        return bool(said.item())

    def _start_quorum(self) -> bool:
        """torchft's quorum, with the heal it asks for; False when it failed. A live peer's
        state that does not load here is a local failure: raised."""
        self.healed_from = None
        try:
            self.manager.start_quorum(timeout=timedelta(seconds=self.settings.quorum_timeout_s))
        except Exception as error:
            if self.manager._healing:  # raised applying a heal's state (_load_from_peer)
                raise
            log.warning("no quorum (%s); trying again", one_line(error))
            # torchft 0.2.0 keeps the failed future and raises it again at the next
            # start_quorum: drop it, so the next try is a new quorum.
            self.manager._quorum_future = None
            if self.quorum_ids is not None:
                self.quorum_ids.forget()
            return False
        members = self.manager.num_participants()
        if self.manager.errored() is not None:
            log.warning("quorum of %d groups: %s", members, one_line(self.manager.errored()))
        return True

    def writes(self) -> bool:
        """Whether this group is the writer of the last quorum: the first, by replica rank, of
        its groups at the quorum's step (torchft's ``max_replica_rank`` 0). Never a group that
        healed in it: groups differ on a step's commit (a peer lost mid-step), and one that did
        not commit the step the others did is no witness of it."""
        answer = self.quorum_ids.last if self.quorum_ids is not None else None
        return answer is not None and answer.max_replica_rank == 0

    def reduce(
        self,
        model: torch.nn.Module,
        samples: int,
        terms: int,
        loss_sum: torch.Tensor,
        stop: threading.Event,
    ) -> torch.Tensor:
        """The step's gradients, summed over every participant and divided by the global
        batch's loss terms, put back into ``.grad``; returns the all-reduced vector (gradients,
        then the counters of :class:`Tail`). Errors of other groups are torchft's to record.
        ``.grad`` comes in as the gradient of this process's share's mean loss over its
        ``terms`` (:func:`~ddp_trainer.per_step.replicas.share_weights`): times the share's
        :func:`~ddp_trainer.per_step.replicas.mean_divisor` it is the share's part of the sum."""
        e, m, device = self.env, self.manager, self.device
        params = [q for q in model.parameters() if q.requires_grad]
        zeros = torch.zeros((), device=device)
        tail = torch.stack(
            [
                zeros + samples,
                zeros + terms,
                loss_sum,
                zeros + float(stop.is_set()),
            ]
        )
        flat = torch.cat(
            [
                *(
                    q.grad.reshape(-1).float()
                    if q.grad is not None
                    else torch.zeros(q.numel(), device=device)
                    for q in params
                ),
                tail,
            ]
        )
        flat[: Tail.SAMPLES].mul_(mean_divisor(terms))  # the share's mean -> its part of the sum
        if self.distributed:
            dist.all_reduce(flat)  # the group's sum, and whether a local rank was asked to stop
        cross = flat[: Tail.STOP]  # the stop flag stays in the group
        nproc = e.world_size
        per = -(-cross.numel() // nproc)
        padded = (
            cross
            if nproc == 1
            else torch.cat([cross, cross.new_zeros(per * nproc - cross.numel())])
        )
        mine = padded[e.local_rank * per : (e.local_rank + 1) * per]
        work = m.allreduce(mine, reduce_op=dist.ReduceOp.SUM)
        self.phase("allreduce")
        work.wait()
        if nproc > 1:
            chunks = [torch.empty_like(mine) for _ in range(nproc)]
            dist.all_gather(chunks, mine)
            cross.copy_(torch.cat(chunks)[: cross.numel()])
        divisor = mean_divisor(float(flat[Tail.TERMS]))
        offset = 0
        for q in params:
            size = q.numel()
            q.grad = (flat[offset : offset + size] / divisor).view_as(q).to(q.dtype)
            offset += size
        return flat

    def commit(
        self, flat: torch.Tensor, before: dict[str, int], global_batch: int, step: int
    ) -> bool:
        """The group's vote on the step: its all-reduce completed and held the whole global
        batch. A failed vote is a step not committed; the local ranks agree on the answer.
        ``step``: the step tried (1-based), for the log."""
        m = self.manager
        samples, batch = float(flat[Tail.SAMPLES]), global_batch
        if m.errored() is None and not whole_batch(samples, batch):
            m.report_error(RuntimeError(f"the step's batch has {samples} samples, not {batch}"))
        self.phase("commit")
        try:
            vote = bool(m.should_commit())
        except Exception as error:
            log.warning("the commit vote failed (%s): the step is redone", error)
            vote = False
        if self.distributed:
            agreed = torch.tensor([float(vote)], device=self.device)
            dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
            if vote and not agreed.item():
                m.load_state_dict(before)  # another local rank did not commit: neither does this
                vote = False
        if not vote and m.errored() is not None:
            log.info(
                "step %d not committed: %s",
                step,
                one_line(m.errored()),
            )
        return vote
