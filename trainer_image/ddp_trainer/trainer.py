"""The training loop: DDP + AMP, exact resume from rank-0 checkpoints, checkpoint on SIGTERM.

:class:`Trainer` reads top to bottom: build the parts (:mod:`~ddp_trainer.parts`), resume
(:mod:`~ddp_trainer.state.checkpoints`), then per step: its LR, forward and backward, the
update (:mod:`~ddp_trainer.step`), its line and report (:mod:`~ddp_trainer.reporting.tally`), a
checkpoint and a hold as due; then the end (:mod:`~ddp_trainer.ending`). The process group is
:mod:`~ddp_trainer.distributed`'s.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ddp_api.trainer_config import TrainerConfig
from ddp_trainer import ending, hold
from ddp_trainer.data import loader
from ddp_trainer.data.batching import Position, advance, step_seed
from ddp_trainer.data.loader import MicroBatches
from ddp_trainer.data.weighting import loss_terms
from ddp_trainer.distributed import (
    CollectiveTimeout,
    DistEnv,
    Interrupted,
    StepAgreement,
    any_rank,
    init_distributed,
)
from ddp_trainer.parts import Parts, build_parts, fit_to_run
from ddp_trainer.reporting.prometheus import TrainerMetrics, listen_address, process_metrics, serve
from ddp_trainer.reporting.stacks import StackWatch
from ddp_trainer.reporting.tally import Tally
from ddp_trainer.start_watch import StartWatch, watch_start
from ddp_trainer.state import store as ckpt
from ddp_trainer.state.checkpoints import Checkpoints, about_run
from ddp_trainer.state.compat import check_resume
from ddp_trainer.state.train_state import gather, log_restored_rng
from ddp_trainer.step import GradientUpdate, NonFiniteSteps, forward_backward, set_lr

log = logging.getLogger("ddp_trainer.trainer")  # the trainer's lines: people and tests grep them

__all__ = ["DistEnv", "Trainer", "run"]  # DistEnv: where tests and benches have found it


class Trainer:
    """One process of a (possibly single-process) DDP training run."""

    def __init__(
        self,
        config: TrainerConfig,
        checkpoint_dir: Path,
        env: DistEnv | None = None,
        parts: Parts | None = None,
        metrics: TrainerMetrics | None = None,
        start_watch: StartWatch | None = None,
    ):
        self.config = config
        self.env = e = env or DistEnv.from_env()
        self.is_main = e.rank == 0
        self.distributed = dist.is_available() and dist.is_initialized()
        self.parts = parts or build_parts(
            config, e.rank, e.local_rank, e.world_size, self.distributed
        )
        self.timeout = CollectiveTimeout(config.pg_timeout_s, self.distributed)
        self.start_watch = start_watch  # a lost machine while the run starts: stepTimeoutS
        metrics = metrics or process_metrics(e)
        keep = config.checkpoint_keep
        self.checkpoints = Checkpoints(checkpoint_dir, keep, e, metrics, self.distributed)
        self.tally = Tally(config, e, self.parts, self.checkpoints, metrics, self.distributed)
        self.update = GradientUpdate(self.parts, config, self.tally)
        self.stop_requested = threading.Event()
        # every thread's stack in the log when a step hangs
        self.stacks = StackWatch(local_rank=e.local_rank, local_ranks=e.local_world_size)
        self.consistent = True  # model and optimizer hold the state of `position`
        agree = functools.partial(any_rank, device=self.parts.device, distributed=self.distributed)
        folder = self.checkpoints.store.directory
        looks = lambda: self.is_main  # noqa: E731  rank 0 looks for release files
        self.holds = hold.Holds(folder, self.tally, self.stacks, agree, self.stop_requested, looks)

    @property
    def position(self) -> Position:
        return self.parts.state.position

    @position.setter
    def position(self, value: Position) -> None:
        self.parts.state.position = value

    # the run ---------------------------------------------------------------------------

    def train(self) -> int:
        """Train to the end (exit code 0) or until SIGTERM (exit code 143)."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda signum, frame: self.stop_requested.set())
        self.resume()
        self.tally.started()
        return self._run_to_end(self._loop)

    def _run_to_end(self, run: Callable[[], int | None]) -> int:
        """``run()`` and how it ends (:mod:`ddp_trainer.ending`): complete (``run`` returns
        None: then :meth:`_finish`; or its exit code), SIGTERM, non-finite steps, or an error;
        then :meth:`close`."""
        try:
            code = run()
        except Interrupted as why:
            code = ending.interrupted(
                why, self.parts, self.checkpoints, self.distributed, self._save_last
            )
        except NonFiniteSteps as why:
            code = ending.diverged(why)
        except Exception:
            step, saved = self.position.step, self.checkpoints.saved_step
            ending.save_after_failure(step, self.is_main, self.consistent, saved, self._save_last)
            self.close()
            raise
        if code is None:
            code = self._finish()
        self.close()
        return code

    def _loop(self) -> None:
        try:
            self._steps()
        finally:
            self.stacks.disarm()
            self._started()

    def _started(self) -> None:
        """Every rank is past its start (or this one ended): the start's watch ends."""
        if self.start_watch is not None:
            self.start_watch.close()

    def _steps(self) -> None:
        """Steps to the end; after each: its line, SIGTERM (on any rank: every rank stops after
        the same step), a checkpoint, a hold, as due."""
        c, p, total = self.config, self.parts, self.parts.total_steps
        self.tally.restart_clock()
        first = True  # the stacks are armed after it: a first step may compile for minutes
        started = time.perf_counter()  # a step's time includes waiting for its data
        steps_left = total - self.position.step
        for micro_batches in loader.steps_from(
            p.train_set, p.batches, c.seed, self.position, steps_left, p.device,
            p.data_workers, c.prefetch_steps,
        ):  # fmt: skip
            lr, grad_norm, agreement = self._train_step(micro_batches)
            if first:  # every rank is past its start: a silent peer is noticed sooner
                self.timeout.set(c.steady_timeout_s)
            step, step_s = self.position.step, time.perf_counter() - started
            self.stacks.arm(step_s)  # a step that takes most of the deadline writes the stacks
            self.tally.step_done(step_s, lr, grad_norm)
            if first or step % c.log_every_steps == 0 or step == total:
                self.tally.progress()  # a collective: the loss of every rank
            if first:  # after that collective, every rank has finished its first step
                self._started()
                first = False
            if agreement.stop():  # the same answer on every rank
                here = self.stop_requested.is_set()
                raise Interrupted("SIGTERM" if here else "SIGTERM on another rank")
            every = c.checkpoint_every_steps
            if every and step % every == 0 and step < total:
                self.save_checkpoint(wait=False)
            if hold.holds_at(step, c.hold_at_steps, total):
                self.holds.wait(step)
            started = time.perf_counter()

    def _train_step(self, micro_batches: MicroBatches) -> tuple[float, float, StepAgreement]:
        """One optimizer step over this rank's share of a global batch (the micro-batches of
        :mod:`ddp_trainer.data.loader`); returns its LR, its gradient norm and what the ranks
        agreed on at its start."""
        p, c, step = self.parts, self.config, self.position.step
        lr = set_lr(p, c, step)
        # Dropout depends only on (seed, step, rank), so a resume replays it exactly.
        torch.manual_seed(step_seed(c.seed, step, self.env.rank))
        terms = [loss_terms(p.count_targets, targets) for _, targets in micro_batches]
        # One small all-reduce per step: SIGTERM anywhere, and the loss terms of all ranks.
        agreement = StepAgreement(
            self.stop_requested.is_set(), sum(terms), p.device, self.distributed
        )
        total_terms = c.global_batch_size if p.count_targets is None else agreement.global_terms
        world, distributed = self.env.world_size, self.distributed
        forward_backward(p, micro_batches, terms, total_terms, world, distributed, self.tally)
        self.consistent = False
        grad_norm = self.update.apply(step + 1)
        self.position = advance(self.position, c.global_batch_size, p.state.num_samples)
        self.consistent = True
        return lr, grad_norm, agreement

    # checkpoints -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything an exact resume needs: each Stateful part's state (the model's with
        plain-module weights; no scheduler: the LR is a pure function of the step), and what
        the run was."""
        parts = gather(self.parts.stateful())
        return {"format": ckpt.FORMAT, **parts, **about_run(self.config, self.env)}

    def resume(self) -> None:
        """Load the newest complete checkpoint, the same one on every rank (rank 0 picks),
        unless its settings differ in one that changes the run's meaning (IncompatibleResume:
        the process fails, nothing is written); then fit the batches and DDP to the run."""
        state = self._load_checkpoint()
        if state is not None:
            self.tally.resumed(saved_world_size=state["worldSize"])
            log_restored_rng(self.parts.state, self.env.world_size, self.distributed)
        fit_to_run(self.parts, self.config, self.distributed)

    def _load_checkpoint(self) -> dict[str, Any] | None:
        """The newest complete checkpoint loaded into the parts (None: there is none), unless its
        settings differ in one that changes the run's meaning (IncompatibleResume)."""
        config = self.config.to_json_dict()
        accept = lambda saved: check_resume(saved.get("config"), config)  # noqa: E731
        return self.checkpoints.resume(self.parts.stateful(), accept=accept)

    def save_checkpoint(self, wait: bool, every_rank: bool = True) -> None:
        """Global rank 0 writes a checkpoint of the current step (others only send their random
        generators' states); the loop blocks only for the copy to CPU unless `wait` is set.
        ``every_rank``: every rank calls this at this step, so rank 0 gathers every rank's
        generators; otherwise (SIGTERM, a failed step) the checkpoint holds rank 0's only."""
        step = self.position.step
        if every_rank:
            self.parts.state.collect_rng(self.distributed)  # a collective
        saved = self.checkpoints.save(step, self.state_dict, wait)
        if saved is not None:
            self.tally.checkpoint(step, saved.blocked_s, synchronous=saved.synchronous)

    # the end (see ddp_trainer.ending) --------------------------------------------------

    def _save_last(self) -> None:
        """The checkpoint of the last step, waited for; no collective: the peers may be gone."""
        self.save_checkpoint(wait=True, every_rank=False)

    def _finish(self) -> int:
        """Training is complete (:func:`ddp_trainer.ending.finish`), then a hold at the last
        step; returns 0 (the caller closes)."""
        c, p, e, tally = self.config, self.parts, self.env, self.tally
        ending.finish(
            c, e, p, self.checkpoints, tally, self.is_main, self.distributed,
            save=lambda: self.save_checkpoint(wait=True), stop_requested=self.stop_requested,
        )  # fmt: skip
        folder = self.checkpoints.store.directory
        ending.hold_at_end(c, p, folder, tally, self.stop_requested)
        return 0

    def close(self) -> None:
        """The last checkpoint write, the final report, the run log: done."""
        self.checkpoints.close()
        self.tally.close()


def run(config: TrainerConfig, checkpoint_dir: Path) -> int:
    """Train in this process (one of torchrun's workers, or alone); returns the exit code.
    PerStep mode (``DDPJOB_FAULT_TOLERANCE``) trains as a replica group instead:
    ``python -m ddp_trainer`` runs :func:`ddp_trainer.per_step.trainer.run_per_step` then."""
    env = DistEnv.from_env()
    metrics = process_metrics(env)
    if env.local_rank == 0:  # one process per node: the port is the pod's, bound once
        serve(metrics.registry, config.metrics_port, listen_address(os.environ))
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit():
        torch.set_num_threads(int(threads))
    watch = watch_start(env, config)  # from before the process group: joining it is a start
    init_distributed(env, config)
    trainer = Trainer(config, checkpoint_dir, env, metrics=metrics, start_watch=watch)
    code = trainer.train()
    if code == 0 and dist.is_initialized():
        dist.destroy_process_group()
    return code
