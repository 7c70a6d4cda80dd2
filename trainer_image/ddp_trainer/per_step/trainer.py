"""Per-step fault tolerance (``DDPJOB_FAULT_TOLERANCE=PerStep``): each node pod is one torchft
replica group that keeps training, step by step, whichever other groups are lost or join.

**Groups and ranks.** A pod runs torchrun standalone (``--nnodes 1``, its own local store): its
``nprocPerNode`` workers are local ranks 0..n-1 of one replica group (``REPLICA_GROUP_ID``), joined
by torchrun's default process group. Every worker has a torchft ``Manager`` (local rank 0's
hosts the group's manager server, which talks to the lighthouse), so local rank r of every group
is rank r's cross-group ring: torchft's reconfigurable process group of the quorum's members
(gloo on CPU, NCCL on CUDA). A step's gradients go: each local rank's share -> a sum over the
group's local ranks (default process group) -> local rank r sums chunk r of that vector across
the groups (``Manager.allreduce``) -> the chunks are gathered back inside the group. Each local
rank heals from its peer rank, so a group's ranks agree on every quorum before they step
(:meth:`~ddp_trainer.per_step.group.ReplicaGroup.quorum`): ranks at different steps after it (a
heal that completed on some of them only) end the group, which starts again.

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

**Exactly-once data.** Step s's global batch is Restart mode's (the same permutation and cursor
arithmetic, :mod:`ddp_trainer.data.sampler`, :func:`~ddp_trainer.data.batching.position_after`);
the participants split it by (participating rank, local rank)
(:func:`~ddp_trainer.per_step.replicas.participant_share`). Each process backpropagates its share's
mean loss, as large as a Restart rank's backward, so that fp16 overflows where Restart mode's does
(:func:`~ddp_trainer.per_step.replicas.share_weights`), and turns it into the sum of (micro-batch
mean loss x loss terms) in float32; the all-reduced vector carries the sample and term counts, and
the summed gradient is divided by the terms: the update is the full batch's mean whoever took which
share. A group commits step s only if its all-reduce completed (so every participant's share is in
it) and the count is the whole batch (:func:`~ddp_trainer.per_step.replicas.whole_batch`); a step
that fails (a peer died mid-step) is redone by the survivors in the next quorum with their new
split. A group that failed a step which others committed is one step behind: its next quorum heals
it.

**Errors.** A lost peer shows up as a gloo error or timeout in the all-reduce, a failed
process-group configure or heal (torchft reports them: no commit), a failed quorum (a lighthouse
that restarts, too few groups: tried again), or a failed commit vote: each becomes "this step is
not committed, redo it". Only local failures (a local rank gone, a model error) end the process.
torchft rebuilds the cross-group process group when the quorum id changes, under a store prefix
of that id; the ids it is given are the job's own
(:class:`~ddp_trainer.per_step.replicas.QuorumIds`), since a replaced lighthouse numbers its
quorums from 1 again.

**The writer** of a quorum is its first group, by replica rank, among those at the quorum's
step (:meth:`~ddp_trainer.per_step.group.ReplicaGroup.writes`), local rank 0: never a group that
healed in it. It writes the checkpoints, with torchft's own state (``torchft``), the progress
reports and the run log, whose step lines carry ``groups`` (the groups that trained the step),
the writer's ``group`` and its ``quorum``. Groups can differ on a step's commit: a writer lost
mid-step, or failing a step the others committed, logs no line for it. So every group keeps its
last step line, and a group that becomes the writer writes it first (with its own time) when
the run log's last step line is older; each committed step then has one line, whoever wrote it.
A group loads a checkpoint only when its first quorum's max step is 0
(:func:`~ddp_trainer.per_step.replicas.loads_checkpoint`: a new job, or every group was lost)
and no other group that has trained beat lately (:mod:`~ddp_trainer.per_step.beats`: a live
group mid-step, left out of a quorum of joiners); else it heals from a live peer. At the last
step the writer saves and marks the run complete; the others wait for that record (if the writer
dies first, they quorum again and one of them is the writer).

**Hangs and the end.** After each committed step a worker arms the stack dump
(:mod:`ddp_trainer.reporting.stacks`), as in Restart mode: no committed step for three quarters of
the operator's progress deadline writes every thread's stack to the log, a wait for a quorum
included (where it waits is then in the log); not at a hold, nor after the last step. At the end
the Manager is shut down and the cross-group process group aborted
(:meth:`~ddp_trainer.per_step.group.ReplicaGroup.close`), and the worker exits without waiting on
library threads (:mod:`ddp_trainer.launch.exits`).

This module is the loop (:class:`PerStepTrainer`); it calls this process's side of torchft
(:mod:`~ddp_trainer.per_step.group`: the Manager, heals, the all-reduce, the commit vote), its
share of each step (:mod:`~ddp_trainer.per_step.share`), the completion record
(:mod:`~ddp_trainer.per_step.completion`) and the test hooks, ``DDPJOB_SAMPLE_LOG`` and
``DDPJOB_TEST_STOP_AT`` (:mod:`~ddp_trainer.per_step.hooks`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ddp_api.trainer_config import TrainerConfig
from ddp_trainer import ending, hold
from ddp_trainer.data.batching import position_after, step_seed
from ddp_trainer.distributed import DistEnv, Interrupted, init_distributed
from ddp_trainer.parts import Parts, build_parts, compiled
from ddp_trainer.per_step.beats import Beats, read_beats
from ddp_trainer.per_step.completion import completed, wait_for_completion
from ddp_trainer.per_step.group import ReplicaGroup, Tail, no_nccl_dumps, quiet_torchft
from ddp_trainer.per_step.hooks import (
    ENV_SAMPLE_LOG,
    ENV_STEP_S,
    ENV_STOP_AT,
    SampleLog,
    StepPace,
    StopAt,
)
from ddp_trainer.per_step.replicas import (
    GroupSettings,
    beat_window_s,
    loads_checkpoint,
    participant_share,
    run_id,
    trained_elsewhere,
)
from ddp_trainer.per_step.share import Shares, aligned, forward_backward
from ddp_trainer.reporting.prometheus import TrainerMetrics, listen_address, process_metrics, serve
from ddp_trainer.step import set_lr
from ddp_trainer.trainer import Trainer

log = logging.getLogger("ddp_trainer.trainer")  # the trainer's lines: people and tests grep them
LIVE_RETRY_S = 0.2  # between the quorums of a group waiting for a live one


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
        parts = group_parts(config, env, group)
        super().__init__(config, checkpoint_dir, env, parts, metrics)
        self.group = group
        self.is_main = False  # the writer: set at each quorum
        # No state of the run is held until the first quorum settles where this group starts
        # (a heal, the checkpoint loaded, or none to load: _begin); till then nothing is saved.
        self.consistent = False
        self.tally.speaks = False
        # Local rank 0 of every group looks for a hold's release file, not the writer's alone:
        # each group holds on its own (the folder is shared).
        self.holds.looks = lambda: env.local_rank == 0
        self.samples = SampleLog(
            os.environ.get(ENV_SAMPLE_LOG), f"{group.replica_id}-{env.local_rank}"
        )
        self.phase = StopAt(os.environ.get(ENV_STOP_AT), lambda: self.position.step)
        self.pace = StepPace(os.environ.get(ENV_STEP_S))
        self.replicas = ReplicaGroup(group, env, parts, self.distributed, self.phase)
        self.shares = Shares(parts.state.num_samples, config.seed)
        self.beats = None  # local rank 0's (ddp_trainer.per_step.beats)
        if env.local_rank == 0:
            folder = self.checkpoints.store.directory
            self.beats = Beats(folder, group.group, lambda: self.position.step)
        self.waited_for_live = False

    def state_dict(self) -> dict[str, Any]:
        """A checkpoint's contents, with torchft's own state (its step count) and the steps in a
        row whose gradient was not finite (a healing group goes on counting from its peer's:
        :meth:`_healed`)."""
        state = super().state_dict()
        state["worldSize"] = self.tally.world  # every group's processes, not this group's
        state["nonFiniteInRow"] = self.update.non_finite_in_row
        if self.replicas.manager is not None:
            state["torchft"] = self.replicas.manager.state_dict()
        return state

    def _healed(self, state: dict[str, Any]) -> None:
        """After a heal: the peer's count of non-finite steps in a row, so that every group
        reaches trainer.maxNonFiniteSteps at the same step (a count from 0 would leave the
        healed group training alone after its peers failed the run). Not taken from a
        checkpoint: every group loads one only when all were lost, and all count from 0 then,
        as Restart mode's ranks do after a restart."""
        self.update.non_finite_in_row = int(state.get("nonFiniteInRow", 0))

    def _quorum(self) -> bool:
        """One quorum (:meth:`ReplicaGroup.quorum`) and its writer (:meth:`ReplicaGroup.writes`).
        A group that becomes the writer first logs its last logged step if the run log lacks it:
        the writer before it did not commit that step (it was lost mid-step, or failed it)."""
        if not self.replicas.quorum():
            return False
        writer = self.replicas.writes()
        if writer and not self.tally.speaks:
            self.tally.catch_up()
        self.is_main = writer and self.env.local_rank == 0
        self.tally.speaks = writer
        return True

    # the run ---------------------------------------------------------------------------

    def train(self) -> int:
        """Train to the end (0), or until SIGTERM (143)."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda signum, frame: self.stop_requested.set())
        self.phase("start")
        self.replicas.start(self.state_dict, self._healed)
        if self.beats is not None:
            self.beats.start()
        try:
            return self._run_to_end(self._run)
        finally:
            self.stacks.disarm()
            if self.beats is not None:
                self.beats.stop()
            self.replicas.close()

    def _run(self) -> int:
        """Quorum, train the quorum's step, again, to the end; returns 0 (the caller closes)."""
        c, e, total, m = self.config, self.env, self.parts.total_steps, self.replicas
        folder = self.checkpoints.store.directory

        def done() -> bool:  # another group may have completed the run
            return completed(folder, e.run_id)

        first, redo, fresh = True, False, True
        started = time.perf_counter()
        while True:
            waited = self.pace()
            if waited > 0:
                self.samples.write(event="paced", waited_s=round(waited, 4))
                started += waited  # the test's wait is no step time
            self.phase("quorum")
            ready = self._quorum()
            if ready and first and not m.errored and loads_checkpoint(m.manager.current_step()):
                ready = not self._live_elsewhere()  # a live group mid-step: wait for it
            if not ready:
                if self.stop_requested.is_set():  # while waiting for peers or the lighthouse
                    raise Interrupted("SIGTERM")
                if done():  # a group that came after the end: no quorum forms again
                    return self._done_elsewhere()
                redo = True
                continue
            step = m.manager.current_step()
            if first:
                if m.errored:
                    redo = True  # the heal failed: a live group was there, quorum again
                    continue
                first = False
                if self._begin(step):
                    continue  # a checkpoint was loaded: quorum again at its step
            if redo and done():
                return self._done_elsewhere()
            before = self.position.step
            self.position = aligned(self.position, step, self.parts.state)
            if fresh or self.position.step != before:
                # The first step since this start, or a heal (the quorum's step is not the one
                # this group reached): the rate counts the steps it trains from here, not those
                # it took from a peer or a checkpoint.
                self.tally.restart_clock()
                fresh = False
            if step >= total:
                self.stacks.disarm()  # waiting for the writer's last checkpoint is no hang
                if done():
                    return self._done_elsewhere()
                if self.tally.speaks:  # the writer group
                    return self._finish()
                timeout_s = self.group.timeout_s
                if wait_for_completion(folder, e.run_id, timeout_s, self.stop_requested):
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
                    self.holds.wait(step)
                    started = time.perf_counter()

    def _live_elsewhere(self) -> bool:
        """Whether another group that has trained beat lately (:mod:`ddp_trainer.per_step.beats`)
        while this group's first quorum has max step 0: then that group is mid-step,
        not lost, and this one quorums again (a moment later) until it is in a quorum with it
        and heals, rather than loading the checkpoint and training a second history beside it.
        Local rank 0 reads the beats; the group's ranks agree."""
        seen = None
        if self.env.local_rank == 0:
            folder = self.checkpoints.store.directory
            window = beat_window_s(self.group.timeout_s)
            seen = trained_elsewhere(read_beats(folder), self.group.group, time.time(), window)
        live = self.replicas.any_rank(seen is not None)
        if live:
            if seen is not None and not self.waited_for_live:
                log.info(
                    "a quorum at step 0, but a group that trained %d steps beat %.1fs ago: not"
                    " loading the checkpoint, waiting for that group in a quorum",
                    *seen,
                )
            self.waited_for_live = True
            time.sleep(LIVE_RETRY_S)
        return live

    def _begin(self, step: int) -> bool:
        """After the first quorum: load the newest checkpoint when no live group has trained a
        step (then True: the groups quorum again at its step), else go on from the heal."""
        e = self.env
        loaded = None
        if loads_checkpoint(step):
            loaded = self._load_checkpoint()
        self.tally.world = self.replicas.manager.num_participants() * e.world_size
        self.tally.groups = self.replicas.manager.num_participants()
        if loaded is not None:
            saved = loaded.get("torchft") or {}
            self.replicas.manager.load_state_dict(
                {"step": loaded["step"], "batches_committed": saved.get("batches_committed", 0)}
            )
            self.tally.resumed(saved_world_size=loaded["worldSize"])
            log.info(
                "no live group to heal from: resumed from checkpoint %s",
                self.checkpoints.resumed_from,
            )
        self.tally.started(group=self.group.group, healedFrom=self.replicas.healed_from)
        self.consistent = True
        return loaded is not None

    def _try_step(self, step: int) -> tuple[bool, bool, float, float]:
        """One try at step ``step`` (0-based) with this quorum; returns (committed, stop, lr,
        gradient norm)."""
        p, c, e, m = self.parts, self.config, self.env, self.replicas.manager
        groups, rank = m.num_participants(), m.participating_rank()
        lr = set_lr(p, c, step)
        flat_rank = (rank or 0) * e.world_size + e.local_rank
        torch.manual_seed(step_seed(c.seed, step, flat_rank))
        share = participant_share(c.global_batch_size, groups, rank, e.world_size, e.local_rank)
        indices = self.shares.indices(self.position, share)
        quorum = m._quorum_id  # only for the sample log: which quorum fed what
        fed = dict(step=step, quorum=quorum, groups=groups, rank=flat_rank)
        if m.errored() is None:
            self.samples.write(event="fed", **fed, indices=indices.tolist())
        self.phase("forward")
        loss_sum, terms, micro = forward_backward(p, indices)
        self.consistent = False
        before = m.state_dict()
        flat = self.replicas.reduce(p.model, len(indices), terms, loss_sum, self.stop_requested)
        stop = bool(flat[Tail.STOP] > 0)
        committed = self.replicas.commit(flat, before, c.global_batch_size, self.position.step + 1)
        grad_norm = float("nan")
        if committed:
            grad_norm = self.update.apply(step + 1)
            self.samples.write(event="committed", **fed, **self._scaler_seen())
            global_terms = float(flat[Tail.TERMS])
            if global_terms:
                self.tally.add_loss(flat[Tail.LOSS] / global_terms, int(global_terms))
            self.tally.world, self.tally.groups = groups * e.world_size, groups
            self.tally.writer = {"group": self.group.group, "quorum": quorum}
            self.tally.share = (len(indices), len(micro))
        else:
            p.optimizer.zero_grad(set_to_none=True)
        self.consistent = True
        return committed, stop, lr, grad_norm

    def _scaler_seen(self) -> dict[str, Any]:
        """The fp16 GradScaler's scale and growth tracker after a committed step, for the sample
        log (a test's check that every group steps it alike, on committed steps only); nothing
        when the log or the scaler is off (reading them syncs with the GPU)."""
        scaler = self.parts.scaler
        if self.samples.file is None or not scaler.is_enabled():
            return {}
        saved = scaler.state_dict()
        return {"scale": saved["scale"], "growth": saved["_growth_tracker"]}

    def _after_step(self, step_s: float, lr: float, grad_norm: float) -> None:
        """The data position after a committed step, its metrics and (when due) its line."""
        c, total = self.config, self.parts.total_steps
        p = self.parts.state
        self.position = position_after(self.position, 1, p.global_batch, p.num_samples)
        step = self.position.step
        self.timeout.set(c.steady_timeout_s)  # every local rank is past its start
        self.stacks.arm(step_s)  # no committed step for most of the deadline writes the stacks
        self.tally.step_done(step_s, lr, grad_norm)
        if step % c.log_every_steps == 0 or step == total or step == 1:
            self.tally.progress()

    def save_checkpoint(self, wait: bool, every_rank: bool = True) -> None:
        """Only the writer group saves (see the module docstring), and only a state of the run:
        not before its first quorum settled where it starts (a SIGTERM while it waits)."""
        if self.tally.speaks and self.consistent:
            self.phase("save")
            super().save_checkpoint(wait, every_rank)

    def _done_elsewhere(self) -> int:
        """Training is complete and another group wrote the final checkpoint: exit 0 (with no
        final report where this group trained nothing: the writer's last one stands)."""
        self.stacks.disarm()  # a hold at the end is no hang
        self.tally.untold_final = False
        log.info(
            "training complete at step %d (the final checkpoint is another group's)",
            self.parts.total_steps,
        )
        folder = self.checkpoints.store.directory
        ending.hold_at_end(self.config, self.parts, folder, self.tally, self.stop_requested)
        return 0


def group_parts(config: TrainerConfig, env: DistEnv, group: GroupSettings) -> Parts:
    """The parts of one process of a group, with the micro-batch cap of a full-strength job:
    with fewer groups a share grows, and runs in more micro-batches rather than in larger ones."""
    distributed = dist.is_available() and dist.is_initialized()
    world = group.groups_hint * env.world_size
    parts = build_parts(config, env.local_rank, env.local_rank, world, distributed)
    if config.compile:
        parts.net = compiled(parts.model)
    return parts


def run_per_step(config: TrainerConfig, checkpoint_dir: Path) -> int:
    """Train as one process of a replica group; returns the exit code."""
    group = GroupSettings.from_env(os.environ)
    quiet_torchft()
    no_nccl_dumps(os.environ)  # before init_distributed makes torchrun's group
    env = dataclasses.replace(DistEnv.from_env(), run_id=run_id(os.environ))
    metrics = process_metrics(env, per_step=True)
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
