"""The training loop: DDP + AMP, exact resume from rank-0 checkpoints, checkpoint on SIGTERM.

Built from: :mod:`~ddp_trainer.parts` (model, optimizer, batches, state),
:mod:`~ddp_trainer.state.checkpoints` (save and resume), :mod:`~ddp_trainer.reporting.tally` (loss,
rate, step lines, progress reports), :mod:`~ddp_trainer.ending` (how a run ends) and
:mod:`~ddp_trainer.distributed` (the process group).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ddp_api.trainer_config import TrainerConfig
from ddp_trainer import ending, hold
from ddp_trainer.data import loader
from ddp_trainer.data.batching import Position, advance, step_seed
from ddp_trainer.data.loader import MicroBatches
from ddp_trainer.data.weighting import empty_loss, loss_terms, loss_weight
from ddp_trainer.distributed import (
    CollectiveTimeout,
    DistEnv,
    StepAgreement,
    any_rank,
    init_distributed,
)
from ddp_trainer.ending import Interrupted, NonFiniteSteps, too_many_non_finite
from ddp_trainer.parts import Parts, build_parts, fit_to_run
from ddp_trainer.per_step.replicas import per_step
from ddp_trainer.reporting.prometheus import TrainerMetrics, listen_address, process_metrics, serve
from ddp_trainer.reporting.stacks import StackWatch
from ddp_trainer.reporting.tally import Tally
from ddp_trainer.schedule import lr_at
from ddp_trainer.state import store as ckpt
from ddp_trainer.state.checkpoints import Checkpoints, about_run
from ddp_trainer.state.compat import check_resume
from ddp_trainer.state.train_state import gather, rng_fingerprint, rng_state

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
    ):
        self.config = config
        self.env = e = env or DistEnv.from_env()
        self.is_main = e.rank == 0
        self.distributed = dist.is_available() and dist.is_initialized()
        self.parts = parts or build_parts(
            config, e.rank, e.local_rank, e.world_size, self.distributed
        )
        self.timeout = CollectiveTimeout(config.pg_timeout_s, self.distributed)
        metrics = metrics or process_metrics(e)
        keep = config.checkpoint_keep
        self.checkpoints = Checkpoints(checkpoint_dir, keep, e, metrics, self.distributed)
        self.tally = Tally(config, e, self.parts, self.checkpoints, metrics, self.distributed)
        self.stop_requested = threading.Event()
        self.stacks = StackWatch()  # every thread's stack in the log when a step hangs
        self.consistent = True  # model and optimizer hold the state of `position`
        self.non_finite_in_row = 0

    @property
    def position(self) -> Position:
        return self.parts.state.position

    @position.setter
    def position(self, value: Position) -> None:
        self.parts.state.position = value

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
        config = self.config.to_json_dict()
        state = self.checkpoints.resume(
            self.parts.stateful(), accept=lambda saved: check_resume(saved.get("config"), config)
        )
        if state is not None:
            self.tally.resumed(saved_world_size=state["worldSize"])
            self._log_restored_rng()
        fit_to_run(self.parts, self.config, self.distributed)

    def _log_restored_rng(self) -> None:
        """Rank 0 logs where each rank's random generators came from and a digest of them (a
        small collective, once per start): a resume shows each rank continuing its own."""
        here = [f"{self.parts.state.restored_rng} ({rng_fingerprint(rng_state())})"]
        ranks: list[Any] = [None] * self.env.world_size if self.distributed else []
        if self.distributed:
            dist.all_gather_object(ranks, here[0])
        for rank, what in enumerate(ranks or here):
            log.info("random generators of rank %d after the resume: %s", rank, what)

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

    # the run ---------------------------------------------------------------------------

    def train(self) -> int:
        """Train to the end (exit code 0) or until SIGTERM (exit code 143)."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda signum, frame: self.stop_requested.set())
        self.resume()
        self.tally.started()
        try:
            try:
                self._loop()
            finally:
                self.stacks.disarm()
        except Interrupted as why:
            return ending.interrupted(self, why)
        except NonFiniteSteps as why:
            return ending.diverged(self, why)
        except Exception:
            ending.save_after_failure(self)
            raise
        return ending.finish(self)

    def _loop(self) -> None:
        """Steps to the end; after each: its line, SIGTERM (on any rank: every rank stops after
        the same step), a checkpoint, a hold, as due."""
        c, total = self.config, self.parts.total_steps
        self.tally.restart_clock()
        first = True  # the stacks are armed after it: a first step may compile for minutes
        started = time.perf_counter()  # a step's time includes waiting for its data
        for micro_batches in self._input_steps():
            lr, grad_norm, agreement = self._train_step(micro_batches)
            if first:  # every rank is past its start: a silent peer is noticed sooner
                self.timeout.set(c.steady_timeout_s)
            step, step_s = self.position.step, time.perf_counter() - started
            self.stacks.arm(step_s)  # a step that takes most of the deadline writes the stacks
            self.tally.step_done(step_s, lr, grad_norm)
            if first or step % c.log_every_steps == 0 or step == total:
                self.tally.progress()  # a collective: the loss of every rank
                first = False
            if agreement.stop():  # the same answer on every rank
                here = self.stop_requested.is_set()
                raise Interrupted("SIGTERM" if here else "SIGTERM on another rank")
            every = c.checkpoint_every_steps
            if every and step % every == 0 and step < total:
                self.save_checkpoint(wait=False)
            if hold.holds_at(step, c.hold_at_steps, total):
                self._hold(step)
            started = time.perf_counter()

    def _input_steps(self) -> Iterator[MicroBatches]:
        """This rank's batches of every step left, from the data position on (see
        :mod:`ddp_trainer.data.loader`)."""
        p, c = self.parts, self.config
        return loader.steps_from(
            p.train_set,
            p.batches,
            c.seed,
            self.position,
            p.total_steps - self.position.step,
            p.device,
            p.data_workers,
            c.prefetch_steps,
        )

    def _train_step(self, micro_batches: MicroBatches) -> tuple[float, float, StepAgreement]:
        """One optimizer step over this rank's share of a global batch; returns its LR, its
        gradient norm and what the ranks agreed on at its start."""
        p, c, step = self.parts, self.config, self.position.step
        lr = lr_at(
            step,
            peak=p.peak_lr,
            warmup_steps=c.warmup_steps,
            total_steps=p.total_steps,
            floor=c.min_lr,
        )
        for group in p.optimizer.param_groups:
            group["lr"] = lr
        # Dropout depends only on (seed, step, rank), so a resume replays it exactly.
        torch.manual_seed(step_seed(c.seed, step, self.env.rank))
        terms = [loss_terms(p.count_targets, targets) for _, targets in micro_batches]
        # One small all-reduce per step: SIGTERM anywhere, and the loss terms of all ranks.
        agreement = StepAgreement(
            self.stop_requested.is_set(), sum(terms), p.device, self.distributed
        )
        # Each micro-batch's mean loss is weighted so that DDP's average over ranks becomes
        # the mean over every sample (or token) of the global batch, however it is split.
        total_terms = c.global_batch_size if p.count_targets is None else agreement.global_terms
        last = len(micro_batches) - 1
        for index, ((inputs, targets), count) in enumerate(zip(micro_batches, terms, strict=True)):
            inputs = inputs.to(p.device, non_blocking=True)
            targets = targets.to(p.device, non_blocking=True)
            sync = index == last or not self.distributed
            with nullcontext() if sync else p.net.no_sync():  # type: ignore[operator]
                with self._autocast():
                    outputs = p.net(inputs)
                    loss = p.loss_fn(outputs, targets)
                weight = loss_weight(count, self.env.world_size, total_terms)
                weighted = loss * weight if count else empty_loss(outputs, loss)
                # A disabled GradScaler (everything but fp16) passes through unchanged.
                p.scaler.scale(weighted).backward()
            if count:
                self.tally.add_loss(loss, count)
        self.consistent = False
        grad_norm = self._apply_gradients(step + 1)
        self.position = advance(self.position, c.global_batch_size, p.state.num_samples)
        self.consistent = True
        return lr, grad_norm, agreement

    def _apply_gradients(self, step: int) -> float:
        """The optimizer update of step ``step`` (1-based) unless its gradient is not finite
        (then skipped and counted; too many in a row raise); returns the gradient norm."""
        p, c = self.parts, self.config
        scaling = p.scaler.is_enabled()
        if scaling:
            p.scaler.unscale_(p.optimizer)  # the true gradients' norm, not the scaled one's
        grads = [q.grad for q in p.model.parameters() if q.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads)  # clip_grad_norm_ in two halves:
        if c.grad_clip_norm:  # no multiplication by 1 when nothing is clipped
            torch.nn.utils.clip_grads_with_norm_(p.model.parameters(), c.grad_clip_norm, norm)
        grad_norm = float(norm)  # after DDP's all-reduce: the same on every rank
        finite = math.isfinite(grad_norm)
        if finite or scaling:  # fp16's GradScaler skips its own overflows (not counted here)
            p.scaler.step(p.optimizer)
            p.scaler.update()
            self.non_finite_in_row = 0
        else:
            self.non_finite_in_row += 1
            self.tally.non_finite(step, grad_norm, self.non_finite_in_row)
            failure = too_many_non_finite(self.non_finite_in_row, c.max_non_finite_steps, step)
            if failure is not None:
                raise failure
        p.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def _autocast(self) -> AbstractContextManager[Any]:
        dtype = self.parts.precision.dtype
        if dtype is None:
            return nullcontext()
        return torch.autocast(self.parts.device.type, dtype=getattr(torch, dtype))

    def _hold(self, step: int) -> None:
        """Waits after ``step`` until its release file exists (see :mod:`ddp_trainer.hold`):
        every rank polls with rank 0, and SIGTERM on any of them stops the run."""
        release = self.checkpoints.store.directory / hold.release_name(step)
        released = self._released(release)
        if not released:
            self.tally.held(step, release, at_end=False)
            self.stacks.disarm()  # a hold is no hang
            while not released:
                time.sleep(hold.POLL_S)
                released = self._released(release)
            self.stacks.arm()
            self.tally.released(step, at_end=False)

    def _released(self, release: Path) -> bool:
        """Whether rank 0 sees ``release``, the same on every rank; raises on SIGTERM anywhere."""
        seen, here = self._sees_release(release), self.stop_requested.is_set
        released, stop = any_rank([seen, here()], self.parts.device, self.distributed)
        if stop:
            raise Interrupted("SIGTERM" if here() else "SIGTERM on another rank while held")
        return released

    def _sees_release(self, release: Path) -> bool:
        """Whether this rank looks for the release file and finds it (rank 0 only)."""
        return self.is_main and release.exists()

    def close(self) -> None:
        """The last checkpoint write, the final report, the run log: done."""
        self.checkpoints.close()
        self.tally.close()


def run(config: TrainerConfig, checkpoint_dir: Path) -> int:
    """Train in this process (one of torchrun's workers, or alone); returns the exit code.
    PerStep mode (``DDPJOB_FAULT_TOLERANCE``) trains as a replica group instead
    (:mod:`ddp_trainer.per_step.trainer`)."""
    if per_step(os.environ):
        from ddp_trainer.per_step.trainer import run_per_step

        return run_per_step(config, checkpoint_dir)
    env = DistEnv.from_env()
    metrics = process_metrics(env)
    if env.local_rank == 0:  # one process per node: the port is the pod's, bound once
        serve(metrics.registry, config.metrics_port, listen_address(os.environ))
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit():
        torch.set_num_threads(int(threads))
    init_distributed(env, config)
    trainer = Trainer(config, checkpoint_dir, env, metrics=metrics)
    code = trainer.train()
    if code == 0 and dist.is_initialized():
        dist.destroy_process_group()
    return code
