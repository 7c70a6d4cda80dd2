"""The training loop: DDP + AMP, exact resume from rank-0 checkpoints, checkpoint on SIGTERM."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ddp_api.trainer_config import TrainerConfig

from . import checkpoint as ckpt
from . import hold
from .batching import Position, advance, step_seed
from .distributed import CollectiveTimeout, DistEnv, any_rank, init_distributed
from .metrics import TrainerMetrics, listen_address, process_metrics, serve
from .parts import Parts, build_parts
from .progress import ProgressReporter, RunLog, progress_record
from .schedule import lr_at
from .state import gather, scatter
from .workloads import evaluate, fetch_batch

log = logging.getLogger(__name__)

EXIT_INTERRUPTED = 128 + signal.SIGTERM


class Interrupted(Exception):
    """SIGTERM arrived (here, or on a peer while held): stop after the current step."""


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
        self.env = env or DistEnv.from_env()
        self.is_main = self.env.rank == 0
        self.metrics = metrics or process_metrics(self.env)
        self.distributed = dist.is_available() and dist.is_initialized()
        self.timeout = CollectiveTimeout(config.pg_timeout_s, self.distributed)
        e = self.env
        self.parts = parts or build_parts(
            config, e.rank, e.local_rank, e.world_size, self.distributed
        )
        parts = self.parts
        self.device, self.model, self.net = parts.device, parts.model, parts.net
        self.optimizer, self.scaler, self.precision = parts.optimizer, parts.scaler, parts.precision
        self.autocast_dtype = getattr(torch, self.precision.dtype) if self.precision.dtype else None
        self.train_set, self.test_set, self.loss_fn = parts.train_set, parts.test_set, parts.loss_fn
        self.global_batch = config.global_batch_size
        self.share, self.sampler = parts.batches, parts.sampler
        self.per_epoch, self.total_steps, self.peak_lr = (
            parts.per_epoch,
            parts.total_steps,
            parts.peak_lr,
        )
        self.state = parts.state

        self.store = ckpt.CheckpointStore(checkpoint_dir, keep=config.checkpoint_keep)
        self.writer = (
            ckpt.AsyncCheckpointWriter(self.store, on_written=self._checkpoint_written)
            if self.is_main
            else None
        )
        self.run_log = RunLog(checkpoint_dir) if self.is_main else None
        self.reporter = ProgressReporter.from_env() if self.is_main else None
        self.resumed_from: str | None = None
        self.saved_step = -1
        self.stop_requested = threading.Event()
        self._consistent = True  # model and optimizer hold the state of `position`
        self._loss_sum = torch.zeros((), device=self.device)
        self._loss_count = 0
        self._last_log = (time.perf_counter(), 0)
        self.lr = 0.0
        self.last_loss = float("nan")
        self.last_rate = 0.0
        self.held_at: int | None = None

    # state -----------------------------------------------------------------------------

    @property
    def position(self) -> Position:
        return self.state.position

    @position.setter
    def position(self, value: Position) -> None:
        self.state.position = value

    def state_dict(self) -> dict[str, Any]:
        """Everything an exact resume needs: each Stateful part's state (the model's with
        plain-module weights; no scheduler: the LR is a pure function of the step), and what
        the run was."""
        return {
            "format": ckpt.FORMAT,
            **gather(self.parts.stateful()),
            "config": self.config.to_json_dict(),
            "worldSize": self.env.world_size,
            "globalBatchSize": self.global_batch,
            "writer": {"rank": self.env.rank, "pid": os.getpid(), "host": socket.gethostname()},
            "time": time.time(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        scatter(state, self.parts.stateful())

    def resume(self) -> None:
        """Load the newest complete checkpoint, the same one on every rank (rank 0 picks)."""
        found = None
        if self.is_main:
            self.store.remove_temporaries()
            found = self.store.latest()
        chosen = [found[0] if found else None]
        if self.distributed:
            dist.broadcast_object_list(chosen, src=0)
        entry = chosen[0]
        if entry is None:
            return
        state = found[1] if found else self.store.load(entry)
        self.load_state_dict(state)
        self.resumed_from = entry.name
        self.saved_step = entry.step
        log.info(
            "resumed from %s: step %d, epoch %d, %d samples into the epoch (saved at world "
            "size %d, now %d)",
            entry.name,
            self.position.step,
            self.position.epoch,
            self.position.samples_in_epoch,
            state["worldSize"],
            self.env.world_size,
        )

    def save_checkpoint(self, wait: bool) -> None:
        """Global rank 0 writes a checkpoint of the current step (others do nothing).

        The training loop blocks only for the copy to CPU unless `wait` is set.
        """
        if self.writer is None or self.run_log is None:
            return
        started = time.perf_counter()
        step = self.position.step
        if wait:
            self.writer.wait()
            writing = time.perf_counter()
            entry = self.store.write(step, self.state_dict())
            self.writer.last = entry
            self._checkpoint_written(entry, time.perf_counter() - writing)
        else:
            self.writer.submit(step, ckpt.snapshot(self.state_dict()))
        self.saved_step = step
        blocked_ms = (time.perf_counter() - started) * 1000
        self.metrics.checkpoint_blocked(blocked_ms / 1000)
        self.run_log.write(
            "checkpoint",
            step=step,
            name=ckpt.checkpoint_name(step),
            blockedMs=round(blocked_ms, 3),
            synchronous=wait,
            rank=self.env.rank,
        )

    def _checkpoint_written(self, entry: ckpt.Entry, seconds: float) -> None:
        self.metrics.checkpoint_written(step=entry.step, seconds=seconds, size=entry.size)

    # one step --------------------------------------------------------------------------

    def _autocast(self) -> AbstractContextManager[Any]:
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _train_step(self, micro_batches: list[torch.Tensor]) -> None:
        lr = lr_at(
            self.position.step,
            peak=self.peak_lr,
            warmup_steps=self.config.warmup_steps,
            total_steps=self.total_steps,
            floor=self.config.min_lr,
        )
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.lr = lr
        # Dropout depends only on (seed, step, rank), so a resume replays it exactly.
        torch.manual_seed(step_seed(self.config.seed, self.position.step, self.env.rank))
        # Each micro-batch's mean loss is weighted so that DDP's average over ranks
        # becomes the mean over the whole global batch, however it is split.
        scale = self.env.world_size / self.global_batch
        last = len(micro_batches) - 1
        for index, indices in enumerate(micro_batches):
            if len(indices) == 0:
                continue
            inputs, targets = fetch_batch(self.train_set, indices)
            inputs = inputs.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            sync = index == last or not self.distributed
            no_sync = nullcontext() if sync else self.net.no_sync()  # type: ignore[operator]
            with no_sync:
                with self._autocast():
                    loss = self.loss_fn(self.net(inputs), targets)
                # A disabled GradScaler (everything but fp16) passes through unchanged.
                self.scaler.scale(loss * (len(indices) * scale)).backward()
            self._loss_sum += loss.detach().float() * len(indices)
            self._loss_count += len(indices)
        self._consistent = False
        if self.config.grad_clip_norm:
            self.scaler.unscale_(self.optimizer)  # clip the true gradients, not scaled ones
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.position = advance(self.position, self.global_batch, self.state.num_samples)
        self._consistent = True

    def _log_progress(self) -> None:
        """Every rank joins the loss all-reduce; rank 0 then writes, logs and reports."""
        self.last_loss = self._mean_loss()
        self.last_rate = self._rate()
        self.metrics.progress(loss=self.last_loss, samples_per_second=self.last_rate)
        if self.is_main:
            self._write_step_line()
            self._report(final=False)

    def _mean_loss(self) -> float:
        """The loss averaged over every sample of every rank since the last call (a collective)."""
        totals = torch.stack(
            [self._loss_sum, torch.tensor(float(self._loss_count), device=self.device)]
        )
        if self.distributed:
            dist.all_reduce(totals)
        self._loss_sum.zero_()
        self._loss_count = 0
        return float(totals[0] / totals[1])

    def _rate(self) -> float:
        """Samples per second over all ranks since the last call."""
        now = time.perf_counter()
        since, steps_then = self._last_log
        self._last_log = (now, self.position.step)
        return (self.position.step - steps_then) * self.global_batch / max(now - since, 1e-9)

    def _write_step_line(self) -> None:
        """Rank 0's `step` line in metrics.jsonl and its log line."""
        assert self.run_log is not None
        p = self.position
        self.run_log.write(
            "step",
            step=p.step,
            epoch=p.epoch,
            samplesInEpoch=p.samples_in_epoch,
            loss=self.last_loss,
            lr=self.lr,
            samplesPerSecond=round(self.last_rate, 3),
            worldSize=self.env.world_size,
            globalBatchSize=self.global_batch,
            perRankBatch=self.share.count,
            accumulation=self.share.accumulation_steps,
            rank=self.env.rank,
            attempt=self.env.restart_count,
        )
        log.info(
            "step %d/%d epoch %d loss %.4f lr %.3g %.1f samples/s world %d",
            p.step,
            self.total_steps,
            p.epoch,
            self.last_loss,
            self.lr,
            self.last_rate,
            self.env.world_size,
        )

    def _report(self, final: bool, urgent: bool = False) -> None:
        if self.reporter is None:
            return
        last = self.writer.last.name if self.writer and self.writer.last else self.resumed_from
        self.reporter.offer(
            progress_record(
                epoch=self.position.epoch,
                step=self.position.step,
                total_steps=self.total_steps,
                loss=self.last_loss,
                samples_per_second=self.last_rate,
                last_checkpoint=last,
                world_size=self.env.world_size,
                now=time.time(),
                held_at_step=self.held_at,
            ),
            final=final,
            urgent=urgent,
        )

    # the run ---------------------------------------------------------------------------

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.stop_requested.set()

    def train(self) -> int:
        """Train to the end (exit code 0) or until SIGTERM (exit code 143)."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)
        self.resume()
        self.metrics.started(
            step=self.position.step,
            epoch=self.position.epoch,
            total_steps=self.total_steps,
            resumed_step=self.saved_step if self.resumed_from else None,
        )
        if self.run_log is not None:
            self.run_log.write(
                "start",
                step=self.position.step,
                epoch=self.position.epoch,
                samplesInEpoch=self.position.samples_in_epoch,
                totalSteps=self.total_steps,
                stepsPerEpoch=self.per_epoch,
                worldSize=self.env.world_size,
                globalBatchSize=self.global_batch,
                perRankBatch=self.share.count,
                accumulation=self.share.accumulation_steps,
                amp=self.precision.label,
                device=str(self.device),
                resumedFrom=self.resumed_from,
                rank=self.env.rank,
                attempt=self.env.restart_count,
            )
        log.info(
            "training %s: %d steps (%d per epoch), global batch %d = %d ranks x %d "
            "(x%d micro-batches), amp %s on %s",
            self.config.workload,
            self.total_steps,
            self.per_epoch,
            self.global_batch,
            self.env.world_size,
            self.share.count,
            self.share.accumulation_steps,
            self.precision.label,
            self.device,
        )
        try:
            self._loop()
        except Interrupted as why:
            log.warning("%s: stopping at step %d", why or "SIGTERM", self.position.step)
            if self.position.step > self.saved_step:
                self.save_checkpoint(wait=True)
            self._close(final=False)
            return EXIT_INTERRUPTED
        except Exception:
            self._save_after_failure()
            raise
        return self._finish()

    def _loop(self) -> None:
        self._last_log = (time.perf_counter(), self.position.step)
        first = True
        every_ckpt, every_log = self.config.checkpoint_every_steps, self.config.log_every_steps
        while self.position.step < self.total_steps:
            self.sampler.set_epoch(self.position.epoch)
            self.sampler.set_start(self.position.samples_in_epoch)
            for micro_batches in self.sampler.batches():
                started = time.perf_counter()
                self._train_step(micro_batches)
                if first:  # every rank is past its start: a silent peer is noticed sooner
                    self.timeout.set(self.config.steady_timeout_s)
                step = self.position.step
                self.metrics.step_done(
                    seconds=time.perf_counter() - started,
                    step=step,
                    epoch=self.position.epoch,
                    lr=self.lr,
                )
                if first or step % every_log == 0 or step == self.total_steps:
                    self._log_progress()
                    first = False
                if self.stop_requested.is_set():
                    raise Interrupted
                if every_ckpt and step % every_ckpt == 0 and step < self.total_steps:
                    self.save_checkpoint(wait=False)
                if hold.holds_at(step, self.config.hold_at_steps, self.total_steps):
                    self._hold(step)
                if step >= self.total_steps or self.position.samples_in_epoch == 0:
                    break

    def _agree(self, released: bool) -> tuple[bool, bool]:
        """(rank 0 found the release file, some rank got SIGTERM), the same on every rank."""
        stop = self.stop_requested.is_set()
        released, stop = any_rank([released, stop], self.device, self.distributed)
        return released, stop

    def _stopped(self) -> Interrupted:
        here = self.stop_requested.is_set()
        return Interrupted("SIGTERM" if here else "SIGTERM on another rank while held")

    def _hold(self, step: int) -> None:
        """Waits after ``step`` until its release file exists (see :mod:`ddp_trainer.hold`)."""
        folder = self.store.directory
        released, stop = self._agree(self.is_main and hold.is_released(folder, step))
        if stop:
            raise self._stopped()
        if released:
            return
        self.held_at = step
        if self.run_log is not None:
            self.run_log.write("hold", step=step, release=hold.release_name(step))
            log.info(
                "holding after step %d until %s exists", step, folder / hold.release_name(step)
            )
        self._report(final=False, urgent=True)
        while not released:
            time.sleep(hold.POLL_S)
            released, stop = self._agree(self.is_main and hold.is_released(folder, step))
            if stop:
                raise self._stopped()
        self.held_at = None
        if self.run_log is not None:
            self.run_log.write("release", step=step)
            log.info("released at step %d", step)
        self._report(final=False, urgent=True)
        self._last_log = (time.perf_counter(), self.position.step)  # the pause is no step time

    def _save_after_failure(self) -> None:
        """A peer died mid-step: rank 0 still holds a consistent state, so keep it."""
        if not self.is_main or not self._consistent or self.position.step <= self.saved_step:
            self._close(final=False)
            return
        try:
            log.warning("a step failed; saving step %d before exiting", self.position.step)
            self.save_checkpoint(wait=True)
        except Exception:
            log.exception("could not save a checkpoint after the failure")
        self._close(final=False)

    def _finish(self) -> int:
        if self.position.step > self.saved_step:
            self.save_checkpoint(wait=True)
        if self.writer is not None:
            self.writer.wait()  # the final checkpoint is on disk before training is called done
            last = self.writer.last.name if self.writer.last else self.resumed_from
            self.store.mark_complete(self.env.run_id, self.position.step, last)
        # Rank 0 evaluates alone while the others wait at the barrier below.
        self.timeout.set(self.config.pg_timeout_s)
        results: dict[str, float] = {}
        if self.is_main and self.config.evaluate and self.test_set is not None:
            results = evaluate(
                self.model,
                self.test_set,
                self.loss_fn,
                self.global_batch,
                self.config.eval_max_batches,
                self.device,
            )
            log.info("evaluation: %s", results)
        if self.run_log is not None:
            self.run_log.write(
                "end",
                step=self.position.step,
                epoch=self.position.epoch,
                worldSize=self.env.world_size,
                rank=self.env.rank,
                **results,
            )
        if self.distributed:
            dist.barrier()
        self._hold_at_end()
        self._close(final=True)
        return 0

    def _hold_at_end(self) -> None:
        """A hold at the last step (:mod:`ddp_trainer.hold`): each rank waits on its own, as the
        collectives are over and a peer may be gone; SIGTERM ends the wait."""
        step, folder = self.position.step, self.store.directory
        if not hold.holds_at_end(step, self.config.hold_at_steps, self.total_steps):
            return
        if hold.is_released(folder, step):
            return
        self.held_at = step
        if self.run_log is not None:
            self.run_log.write("hold", step=step, release=hold.release_name(step))
            log.info("training complete; holding until %s exists", folder / hold.release_name(step))
        self._report(final=False, urgent=True)
        while not hold.is_released(folder, step) and not self.stop_requested.is_set():
            time.sleep(hold.POLL_S)
        self.held_at = None
        if self.run_log is not None:
            self.run_log.write("release", step=step)

    def _close(self, final: bool) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception:
                log.exception("a background checkpoint write failed")
        if self.reporter is not None:
            self._report(final=True)
            self.reporter.close()
        if self.run_log is not None:
            self.run_log.close()
            self.run_log = None


def run(config: TrainerConfig, checkpoint_dir: Path) -> int:
    """Train in this process (one of torchrun's workers, or alone); returns the exit code."""
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
