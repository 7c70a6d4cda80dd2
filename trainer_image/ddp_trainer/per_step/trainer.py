"""Per-step fault tolerance (``DDPJOB_FAULT_TOLERANCE=PerStep``): each node pod is one torchft
replica group that keeps training, step by step, whichever other groups are lost or join.

**Groups and ranks.** A pod runs torchrun standalone (``--nnodes 1``, its own local store): its
``nprocPerNode`` workers are local ranks 0..n-1 of one replica group (``REPLICA_GROUP_ID``), joined
by torchrun's default process group. Every worker has a torchft ``Manager`` (local rank 0's
hosts the group's manager server, which talks to the lighthouse), so local rank r of every group
is rank r's cross-group ring: torchft's reconfigurable process group of the quorum's members
(gloo on CPU, NCCL on CUDA). A step's gradients go: each local rank's share -> a sum over the
group's local ranks (default process group) -> local rank r sums chunk r of that vector across
the groups (``Manager.allreduce``) -> the chunks are gathered back inside the group.

**Not torchft's DistributedDataParallel.** Its comm hook crashes survivors when a peer dies
mid-all-reduce (``assert fut._fut`` in ``torchft/ddp.py``, upstream issues #295 and #304; a probe
here crashed both survivors of one SIGKILL). ``Manager.allreduce(...).wait()`` instead turns a
lost peer's error into ``manager.errored()``: the step is not committed, never a raised error.

**Synchronous quorum** (``use_async_quorum=False``). ``start_quorum`` returns once the quorum
is known and a joining group has healed, i.e. loaded a live peer's state of the quorum's max step
over torchft's HTTP checkpoint transport, before its forward pass. torchft then counts every
member of the quorum as participating (participating rank = replica rank, participants = quorum
size); in async mode only the groups already at the max step participate and healing groups add
zeros, which would make the split below depend on who was healing. So every participant trains
the same step, ``manager.current_step()``.

**Exactly-once data.** Step s's global batch is Restart mode's (the same permutation and
cursor arithmetic, :mod:`ddp_trainer.data.sampler`,
:func:`~ddp_trainer.data.batching.position_after`); the participants split it by (participating
rank, local rank) (:func:`~ddp_trainer.per_step.replicas.participant_share`). Each micro-batch's
mean loss is weighted by its loss terms; the all-reduced vector carries the sample and term counts,
and the summed gradient is divided by the terms: the update is the full batch's mean whoever took
which share. A group commits step s only if its all-reduce completed (so every participant's share
is in it) and the count is the whole batch (:func:`~ddp_trainer.per_step.replicas.whole_batch`); a
step that fails (a peer died mid-step) is redone by the survivors in the next quorum with their new
split. A group that failed a step which others committed is one step behind: its next quorum heals
it.

**Errors.** A lost peer shows up as a gloo error or timeout in the all-reduce, a failed
process-group configure or heal (torchft reports them: no commit), a failed quorum (a lighthouse
that restarts, too few groups: tried again), or a failed commit vote: each becomes "this step is
not committed, redo it". Only local failures (a local rank gone, a model error) end the process.

**Checkpoints** are written by the writer: participating rank 0 of the last quorum, local rank
0, with torchft's own state (``torchft``). A group loads one only when its first quorum's max step
is 0 (:func:`~ddp_trainer.per_step.replicas.loads_checkpoint`: a new job, or every group was lost);
else it heals from a live peer. Progress reports and the run log come from the writer, with
``groups``: the groups that trained the last committed step. At the last step the writer saves
and marks the run complete; the others wait for that record (if the writer dies first, they
quorum again and one of them is the writer).

Test hooks (off unless set): ``DDPJOB_SAMPLE_LOG`` (a folder: each process appends the sample
indices it fed and the steps it committed) and ``DDPJOB_TEST_STOP_AT`` (a file naming a phase:
``start``, ``quorum``, ``serve``, ``heal``, ``forward``, ``allreduce``, ``commit``; the process
writes ``<file>.reached`` there and waits while the file names it).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ddp_api.trainer_config import TrainerConfig
from ddp_trainer import ending, hold
from ddp_trainer.data.batching import Position, position_after, step_seed
from ddp_trainer.data.sampler import global_order
from ddp_trainer.data.weighting import empty_loss, loss_terms
from ddp_trainer.data.workloads import fetch_batch
from ddp_trainer.distributed import DistEnv, init_distributed
from ddp_trainer.ending import Interrupted, NonFiniteSteps
from ddp_trainer.parts import build_parts, compiled
from ddp_trainer.per_step.replicas import (
    GroupSettings,
    loads_checkpoint,
    mean_divisor,
    micro_split,
    participant_share,
    run_id,
    url_host,
    whole_batch,
)
from ddp_trainer.reporting.prometheus import TrainerMetrics, listen_address, process_metrics, serve
from ddp_trainer.schedule import lr_at
from ddp_trainer.state.compat import check_resume
from ddp_trainer.state.store import read_completion
from ddp_trainer.trainer import Trainer

log = logging.getLogger("ddp_trainer.trainer")  # the trainer's lines: people and tests grep them

ENV_SAMPLE_LOG = "DDPJOB_SAMPLE_LOG"
ENV_STOP_AT = "DDPJOB_TEST_STOP_AT"
QUORUM_RETRIES = 10  # the manager server's own tries at the lighthouse within one quorum
COMPLETION_POLL_S = 0.2


class _Tail:
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
    """The cross-group process group: NCCL on CUDA (aborted on a lost peer), else gloo."""
    from torchft.process_group import ProcessGroupGloo, ProcessGroupNCCL

    if device.type == "cuda":
        return ProcessGroupNCCL(timeout=timeout)
    return ProcessGroupGloo(timeout=timeout)


class SampleLog:
    """``DDPJOB_SAMPLE_LOG``: one JSON line per step this process fed and per step it committed,
    in a file of its own (appended, flushed per line: a SIGKILL loses nothing written)."""

    def __init__(self, folder: str | None, name: str):
        self.file = None
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            path = Path(folder) / f"{name}-{os.getpid()}.jsonl"
            self.file = open(path, "a", buffering=1)  # noqa: SIM115 (lives as long as the run)

    def write(self, **fields: Any) -> None:
        if self.file is not None:
            self.file.write(json.dumps({"time": round(time.time(), 4), **fields}) + "\n")


class PerStepTrainer(Trainer):
    """One process of one replica group (see the module docstring)."""

    def __init__(
        self,
        config: TrainerConfig,
        checkpoint_dir: Path,
        env: DistEnv,
        group: GroupSettings,
        metrics: TrainerMetrics | None = None,
    ):
        distributed = dist.is_available() and dist.is_initialized()
        # The micro-batch cap of a full-strength job: with fewer groups a share grows, and runs
        # in more micro-batches rather than in larger ones.
        world = group.groups_hint * env.world_size
        parts = build_parts(config, env.local_rank, env.local_rank, world, distributed)
        if config.compile:
            parts.net = compiled(parts.model)
        super().__init__(config, checkpoint_dir, env, parts, metrics)
        self.group = group
        self.is_main = False  # the writer: set at each quorum
        self.tally.speaks = False
        self.manager: Any = None
        self.healed_from: str | None = None  # the last heal: "step N from <address>"
        self.samples = SampleLog(
            os.environ.get(ENV_SAMPLE_LOG), f"{group.replica_id}-{env.local_rank}"
        )
        self.stop_at = os.environ.get(ENV_STOP_AT)
        self._order: tuple[int, torch.Tensor] | None = None

    # torchft ---------------------------------------------------------------------------

    def _start_manager(self) -> None:
        from torchft import Manager

        g, e = self.group, self.env
        timeout = timedelta(seconds=g.timeout_s)
        self.manager = Manager(
            pg=_cross_group_pg(self.parts.device, timeout),
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

    def _state_for_peer(self) -> dict[str, Any]:
        """What a healing peer loads: a checkpoint's contents (called by torchft when a peer
        heals from this group)."""
        self._phase("serve")
        return self.state_dict()

    def _load_from_peer(self, state: dict[str, Any]) -> None:
        """Loads a live peer's state (torchft calls it, in the main thread, while healing)."""
        self._phase("heal")
        from ddp_trainer.state.train_state import scatter

        scatter(state, self.parts.stateful())
        self.healed_from = f"step {state['step']}"
        log.info(
            "healed from a live peer: step %d (no checkpoint loaded)",
            self.parts.state.position.step,
        )

    def state_dict(self) -> dict[str, Any]:
        """A checkpoint's contents, with torchft's own state (its step count)."""
        state = super().state_dict()
        if self.manager is not None:
            state["torchft"] = self.manager.state_dict()
        return state

    def _quorum(self) -> bool:
        """One quorum (healing this group if it is behind); False when it failed: the
        lighthouse is away, too few groups, a peer vanished while it formed."""
        self.healed_from = None
        try:
            self.manager.start_quorum(timeout=timedelta(seconds=self.group.quorum_timeout_s))
        except Exception as error:
            log.warning("no quorum (%s); trying again", str(error).splitlines()[0][:300])
            # torchft 0.2.0 keeps the failed future and raises it again at the next
            # start_quorum: drop it, so the next try is a new quorum.
            self.manager._quorum_future = None
            return False
        members = self.manager.num_participants()
        rank = self.manager.participating_rank()
        writer = rank == 0
        self.is_main = writer and self.env.local_rank == 0
        self.tally.speaks = writer
        if self.manager.errored() is not None:
            log.warning("quorum of %d groups: %s", members, self.manager.errored())
        return True

    # the run ---------------------------------------------------------------------------

    def train(self) -> int:
        """Train to the end (0), or until SIGTERM (143)."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda signum, frame: self.stop_requested.set())
        self._phase("start")
        self._start_manager()
        try:
            try:
                return self._run()
            except Interrupted as why:
                return ending.interrupted(self, why)
            except NonFiniteSteps as why:
                return ending.diverged(self, why)
            except Exception:
                ending.save_after_failure(self)
                raise
        finally:
            self.manager.shutdown(wait=False)

    def _run(self) -> int:
        c, total = self.config, self.parts.total_steps
        first, redo = True, False
        self.tally.restart_clock()
        started = time.perf_counter()
        while True:
            self._phase("quorum")
            if not self._quorum():
                if self.stop_requested.is_set():  # while waiting for peers or the lighthouse
                    raise Interrupted("SIGTERM")
                redo = True
                continue
            step = self.manager.current_step()
            if first:
                if self.manager.errored() is not None:
                    redo = True  # the heal failed: a live group was there, quorum again
                    continue
                first = False
                if self._begin(step):
                    continue  # a checkpoint was loaded: quorum again at its step
            if redo and self._completed():
                return self._done_elsewhere()
            self._align(step)
            if step >= total:
                if self._completed():
                    return self._done_elsewhere()
                if self.tally.speaks:  # the writer group
                    return ending.finish(self)
                if self._wait_for_completion():
                    return self._done_elsewhere()
                continue
            committed, stop, lr, grad_norm = self._try_step(step)
            redo = not committed
            if committed:
                self._after_step(time.perf_counter() - started, lr, grad_norm)
                started = time.perf_counter()
            if stop:
                raise Interrupted(
                    "SIGTERM" if self.stop_requested.is_set() else "SIGTERM on a local rank"
                )
            if committed:
                step = self.position.step
                every = c.checkpoint_every_steps
                if every and step % every == 0 and step < total and self.tally.speaks:
                    self.save_checkpoint(wait=False)
                if hold.holds_at(step, c.hold_at_steps, total):
                    self._hold(step)
                    started = time.perf_counter()

    def _begin(self, step: int) -> bool:
        """After the first quorum: load the newest checkpoint when no live group has trained a
        step (then True: the groups quorum again at its step), else go on from the heal."""
        e = self.env
        loaded = None
        if loads_checkpoint(step):
            config = self.config.to_json_dict()
            loaded = self.checkpoints.resume(
                self.parts.stateful(),
                accept=lambda saved: check_resume(saved.get("config"), config),
            )
        if loaded is not None:
            saved = loaded.get("torchft") or {}
            self.manager.load_state_dict(
                {"step": loaded["step"], "batches_committed": saved.get("batches_committed", 0)}
            )
            self.tally.resumed(saved_world_size=loaded["worldSize"])
            log.info(
                "no live group to heal from: resumed from checkpoint %s",
                self.checkpoints.resumed_from,
            )
        self.tally.world = self.manager.num_participants() * e.world_size
        self.tally.groups = self.manager.num_participants()
        self.tally.started(group=self.group.group, healedFrom=self.healed_from)
        return loaded is not None

    def _align(self, step: int) -> None:
        """The data position of ``step``: a pure function of it (the global batch never changes
        in a run), the same on every group whatever it healed or loaded."""
        p = self.parts.state
        here = position_after(Position(0, 0, 0), step, p.global_batch, p.num_samples)
        if here != self.position:
            log.warning("data position %s set to step %d's %s", self.position, step, here)
            self.position = here

    def _indices(self, share: tuple[int, int]) -> torch.Tensor:
        """This process's sample indices of the current step: its share of the global batch."""
        pos, p = self.position, self.parts
        if self._order is None or self._order[0] != pos.epoch:
            self._order = (
                pos.epoch,
                global_order(p.state.num_samples, self.config.seed, pos.epoch),
            )
        start, count = share
        first = pos.samples_in_epoch + start
        return self._order[1][first : first + count]

    def _try_step(self, step: int) -> tuple[bool, bool, float, float]:
        """One try at step ``step`` (0-based) with this quorum; returns (committed, stop, lr,
        gradient norm)."""
        p, c, e, m = self.parts, self.config, self.env, self.manager
        groups, rank = m.num_participants(), m.participating_rank()
        lr = lr_at(
            step,
            peak=p.peak_lr,
            warmup_steps=c.warmup_steps,
            total_steps=p.total_steps,
            floor=c.min_lr,
        )
        for param_group in p.optimizer.param_groups:
            param_group["lr"] = lr
        flat_rank = (rank or 0) * e.world_size + e.local_rank
        torch.manual_seed(step_seed(c.seed, step, flat_rank))
        share = participant_share(c.global_batch_size, groups, rank, e.world_size, e.local_rank)
        indices = self._indices(share)
        quorum = m._quorum_id  # only for the sample log: which quorum fed what
        if m.errored() is None:
            self.samples.write(
                event="fed",
                step=step,
                quorum=quorum,
                groups=groups,
                rank=flat_rank,
                indices=indices.tolist(),
            )
        self._phase("forward")
        loss_sum = torch.zeros((), device=p.device)
        terms = 0
        micro = micro_split(len(indices), p.state.micro_batch_cap)
        for part in indices.split(list(micro)):
            inputs, targets = fetch_batch(p.train_set, part)
            inputs = inputs.to(p.device, non_blocking=True)
            targets = targets.to(p.device, non_blocking=True)
            count = loss_terms(p.count_targets, targets)
            with self._autocast():
                outputs = p.net(inputs)
                loss = p.loss_fn(outputs, targets)
            weighted = loss * count if count else empty_loss(outputs, loss)
            p.scaler.scale(weighted).backward()
            if count:
                loss_sum += loss.detach().float() * count
                terms += count
        self.consistent = False
        before = m.state_dict()
        flat = self._reduce(len(indices), terms, loss_sum)
        stop = bool(flat[_Tail.STOP] > 0)
        committed = self._commit(flat, before)
        grad_norm = float("nan")
        if committed:
            grad_norm = self._apply_gradients(step + 1)
            self.samples.write(
                event="committed", step=step, quorum=quorum, groups=groups, rank=flat_rank
            )
            global_terms = float(flat[_Tail.TERMS])
            if global_terms:
                self.tally.add_loss(flat[_Tail.LOSS] / global_terms, int(global_terms))
            self.tally.world, self.tally.groups = groups * e.world_size, groups
            self.tally.share = (len(indices), len(micro))
        else:
            p.optimizer.zero_grad(set_to_none=True)
        self.consistent = True
        return committed, stop, lr, grad_norm

    def _reduce(self, samples: int, terms: int, loss_sum: torch.Tensor) -> torch.Tensor:
        """The step's gradients, summed over every participant and divided by the global
        batch's loss terms, put back into ``.grad``; returns the all-reduced vector (gradients,
        then the counters of :class:`_Tail`). Errors of other groups are torchft's to record."""
        p, e, m = self.parts, self.env, self.manager
        params = [q for q in p.model.parameters() if q.requires_grad]
        zeros = torch.zeros((), device=p.device)
        tail = torch.stack(
            [
                zeros + samples,
                zeros + terms,
                loss_sum,
                zeros + float(self.stop_requested.is_set()),
            ]
        )
        flat = torch.cat(
            [
                *(
                    q.grad.reshape(-1).float()
                    if q.grad is not None
                    else torch.zeros(q.numel(), device=p.device)
                    for q in params
                ),
                tail,
            ]
        )
        if self.distributed:
            dist.all_reduce(flat)  # the group's sum, and whether a local rank was asked to stop
        cross = flat[: _Tail.STOP]  # the stop flag stays in the group
        nproc = e.world_size
        per = -(-cross.numel() // nproc)
        padded = (
            cross
            if nproc == 1
            else torch.cat([cross, cross.new_zeros(per * nproc - cross.numel())])
        )
        mine = padded[e.local_rank * per : (e.local_rank + 1) * per]
        work = m.allreduce(mine, reduce_op=dist.ReduceOp.SUM)
        self._phase("allreduce")
        work.wait()
        if nproc > 1:
            chunks = [torch.empty_like(mine) for _ in range(nproc)]
            dist.all_gather(chunks, mine)
            cross.copy_(torch.cat(chunks)[: cross.numel()])
        divisor = mean_divisor(float(flat[_Tail.TERMS]))
        offset = 0
        for q in params:
            size = q.numel()
            q.grad = (flat[offset : offset + size] / divisor).view_as(q).to(q.dtype)
            offset += size
        return flat

    def _commit(self, flat: torch.Tensor, before: dict[str, int]) -> bool:
        """The group's vote on the step: its all-reduce completed and held the whole global
        batch. A failed vote is a step not committed; the local ranks agree on the answer."""
        m = self.manager
        samples, batch = float(flat[_Tail.SAMPLES]), self.config.global_batch_size
        if m.errored() is None and not whole_batch(samples, batch):
            m.report_error(RuntimeError(f"the step's batch has {samples} samples, not {batch}"))
        self._phase("commit")
        try:
            vote = bool(m.should_commit())
        except Exception as error:
            log.warning("the commit vote failed (%s): the step is redone", error)
            vote = False
        if self.distributed:
            agreed = torch.tensor([float(vote)], device=self.parts.device)
            dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
            if vote and not agreed.item():
                m.load_state_dict(before)  # another local rank did not commit: neither does this
                vote = False
        if not vote and m.errored() is not None:
            log.info(
                "step %d not committed: %s",
                self.position.step + 1,
                str(m.errored()).splitlines()[0][:300],
            )
        return vote

    def _after_step(self, step_s: float, lr: float, grad_norm: float) -> None:
        """The data position after a committed step, its metrics and (when due) its line."""
        c, total = self.config, self.parts.total_steps
        p = self.parts.state
        self.position = position_after(self.position, 1, p.global_batch, p.num_samples)
        step = self.position.step
        self.timeout.set(c.steady_timeout_s)  # every local rank is past its start
        self.tally.step_done(step_s, lr, grad_norm)
        if step % c.log_every_steps == 0 or step == total or step == 1:
            self.tally.progress()

    def _sees_release(self, release: Path) -> bool:
        """Local rank 0 of every group looks for a hold's release file, not the writer's
        alone: each group holds on its own (the folder is shared)."""
        return self.env.local_rank == 0 and release.exists()

    def save_checkpoint(self, wait: bool, every_rank: bool = True) -> None:
        """Only the writer group saves (see the module docstring)."""
        if self.tally.speaks:
            super().save_checkpoint(wait, every_rank)

    # the end ---------------------------------------------------------------------------

    def _completed(self) -> bool:
        done = read_completion(self.checkpoints.store.directory)
        return done is not None and done.run_id == self.env.run_id

    def _wait_for_completion(self) -> bool:
        """A group that trained the last step but is not the writer waits for the writer's
        completion record; False: none came (the writer was lost), quorum again."""
        deadline = time.monotonic() + max(30.0, 10 * self.group.timeout_s)
        while time.monotonic() < deadline:
            if self._completed():
                return True
            if self.stop_requested.is_set():
                raise Interrupted("SIGTERM")
            time.sleep(COMPLETION_POLL_S)
        log.warning("no completion record from the writer: quorum again to elect one")
        return False

    def _done_elsewhere(self) -> int:
        """Training is complete and another group wrote the final checkpoint: exit 0."""
        log.info(
            "training complete at step %d (the final checkpoint is another group's)",
            self.parts.total_steps,
        )
        ending.hold_at_end(self)
        self.close()
        return 0

    # test hooks ------------------------------------------------------------------------

    def _phase(self, name: str) -> None:
        """``DDPJOB_TEST_STOP_AT``: while its file names this phase, say so (``<file>.reached``)
        and wait: a test kills the group there, or lets it go on by changing the file."""
        if self.stop_at is None or self._names(name) is False:
            return
        Path(self.stop_at + ".reached").write_text(f"{name} {os.getpid()}\n")
        while self._names(name):
            time.sleep(0.05)

    def _names(self, phase: str) -> bool:
        try:
            return Path(str(self.stop_at)).read_text().strip() == phase
        except OSError:
            return False


def quiet_torchft() -> None:
    """torchft logs several lines per step at INFO (its Rust side reads RUST_LOG when it is
    first imported): warnings only, unless RUST_LOG says otherwise. This module's own lines say
    what matters (quorums that fail, heals, steps redone)."""
    os.environ.setdefault("RUST_LOG", "warn")
    logging.getLogger("torchft").setLevel(logging.WARNING)


def run_per_step(config: TrainerConfig, checkpoint_dir: Path) -> int:
    """Train as one process of a replica group; returns the exit code."""
    group = GroupSettings.from_env(os.environ)
    quiet_torchft()
    env = dataclasses.replace(DistEnv.from_env(), run_id=run_id(os.environ))
    metrics = process_metrics(env)
    if env.local_rank == 0:
        serve(metrics.registry, config.metrics_port, listen_address(os.environ))
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit():
        torch.set_num_threads(int(threads))
    init_distributed(env, config)  # torchrun's local process group: this group's ranks
    trainer = PerStepTrainer(config, checkpoint_dir, env, group, metrics)
    code = trainer.train()
    if code == 0 and dist.is_initialized():
        dist.destroy_process_group()
    return code
