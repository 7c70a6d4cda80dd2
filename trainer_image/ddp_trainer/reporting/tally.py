"""The run's tally: the loss and the rate between two step lines (every rank), and what rank
0 tells of the run: its lines in ``metrics.jsonl`` (:mod:`~ddp_trainer.reporting.run_log`),
its log lines, its progress report to the DDPJob, and the Prometheus progress gauges."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ddp_api.trainer_config import TrainerConfig
from ddp_trainer.data.batching import Position
from ddp_trainer.distributed import DistEnv
from ddp_trainer.parts import Parts
from ddp_trainer.reporting.progress import ProgressReporter, progress_record
from ddp_trainer.reporting.prometheus import TrainerMetrics
from ddp_trainer.reporting.run_log import RunLog
from ddp_trainer.state.checkpoints import Checkpoints
from ddp_trainer.state.store import checkpoint_name

log = logging.getLogger("ddp_trainer.trainer")  # the trainer's lines: people and tests grep them


class Tally:
    """Counts what happens in a run and tells it (rank 0 writes; every rank sums its loss)."""

    def __init__(
        self,
        config: TrainerConfig,
        env: DistEnv,
        parts: Parts,
        checkpoints: Checkpoints,
        metrics: TrainerMetrics,
        distributed: bool,
    ):
        self.config, self.env, self.parts, self.metrics = config, env, parts, metrics
        self.checkpoints, self.distributed = checkpoints, distributed
        main = env.rank == 0
        self.run_log = RunLog(checkpoints.store.directory) if main else None
        self.reporter = ProgressReporter.from_env() if main else None
        # Whether this process tells the run (its lines and reports): global rank 0; in PerStep
        # mode the writing participant of the last quorum (ddp_trainer.per_step sets it).
        self.speaks = main
        self.world = env.world_size  # processes that trained the last step
        self.groups: int | None = None  # PerStep mode: replica groups that trained it
        # PerStep mode: the writer's group and the quorum of the last step, on its step line
        # (whose view of the run a line is, when groups disagree on a step's commit)
        self.writer: dict[str, int] = {}
        self.last_step_line: dict[str, Any] | None = None  # written or not (catch_up)
        # PerStep mode: this process's (samples, micro-batches) of the last step (its share
        # changes with the groups); else the fixed share of ``parts.batches``.
        self.share: tuple[int, int] | None = None
        self._loss_sum = torch.zeros((), device=parts.device)
        self._loss_count = 0
        self._last_log = (time.perf_counter(), 0)
        self.lr = 0.0
        self.grad_norm = float("nan")
        self.skipped_steps = 0  # steps with a non-finite loss or gradient, in this process
        self.last_loss = float("nan")
        self.last_rate = 0.0
        self.rate_steps = 0  # the steps the last rate counted (those trained since its clock)
        self.held_at: int | None = None
        # Whether this start has told anything (a step trained, or a report offered), and
        # whether its final report waits on that: in PerStep mode a group that came up as another
        # group of the run completed it trains nothing, and its report (no loss, no rate, its
        # world alone) would replace the last one of the groups that trained. A start that
        # resumes a finished run's last checkpoint reports its position as before.
        self.told = False
        self.untold_final = True

    def line(self, event: str, **fields: Any) -> None:
        """One line of ``metrics.jsonl`` (rank 0; nothing elsewhere)."""
        if self.run_log is not None and self.speaks:
            self.run_log.write(event, **fields)

    def _shape(self) -> dict[str, Any]:
        """The run's shape in the last step: its world, batch, share and groups."""
        share = self.parts.batches
        count, micro = self.share or (share.count, share.accumulation_steps)
        batch = self.config.global_batch_size
        return run_shape(self.world, batch, count, micro, self.groups)

    def started(self, **extra: Any) -> None:
        """The run starts (or resumes): the metrics, the ``start`` line (with ``extra``) and the
        log line."""
        p, parts, e = self.parts.state.position, self.parts, self.env
        resumed_from = self.checkpoints.resumed_from
        self.metrics.started(
            step=p.step,
            epoch=p.epoch,
            total_steps=parts.total_steps,
            resumed_step=self.checkpoints.saved_step if resumed_from else None,
        )
        self.line("start", **_start_fields(p, parts, self._shape(), resumed_from, e), **extra)
        _log_start(self.config, e, parts, self.groups)

    def resumed(self, saved_world_size: int) -> None:
        """The resume's log line (``self.world``: the processes that train now)."""
        p = self.parts.state.position
        _log_resumed(self.checkpoints.resumed_from, p, saved_world_size, self.world)

    def restart_clock(self) -> None:
        """The rate counts from now (training starts, or a hold ends: the pause is no step time)."""
        self._last_log = (time.perf_counter(), self.parts.state.position.step)

    def add_loss(self, loss: torch.Tensor, terms: int) -> None:
        """A micro-batch's mean loss over ``terms`` loss terms (samples, or tokens)."""
        self._loss_sum += loss.detach().float() * terms
        self._loss_count += terms

    def step_done(self, seconds: float, lr: float, grad_norm: float) -> None:
        p = self.parts.state.position
        self.lr, self.grad_norm = lr, grad_norm
        self.told = True
        self.metrics.step_done(
            seconds=seconds, step=p.step, epoch=p.epoch, lr=lr, grad_norm=grad_norm
        )
        self.metrics.membership(world_size=self.world, groups=self.groups)

    def non_finite(self, step: int, grad_norm: float, in_row: int) -> None:
        """Step ``step`` (1-based) had a non-finite loss or gradient and was skipped."""
        self.skipped_steps += 1
        self.metrics.non_finite_step()
        if self.env.rank == 0:  # every rank saw the same norm: one line tells it
            limit, skipped = self.config.max_non_finite_steps, self.skipped_steps
            _log_non_finite(step, grad_norm, in_row, limit, skipped)

    def progress(self) -> None:
        """Every rank joins the loss all-reduce; rank 0 then writes, logs and reports."""
        self.last_loss = self._mean_loss()
        self.last_rate = self._rate()
        self.metrics.progress(loss=self.last_loss, samples_per_second=self.last_rate)
        self._write_step_line()
        if self.speaks:
            self.report(final=False)

    def _mean_loss(self) -> float:
        """The loss averaged over every loss term of every rank since the last call (a
        collective)."""
        count = torch.tensor(float(self._loss_count), device=self.parts.device)
        totals = torch.stack([self._loss_sum, count])
        if self.distributed:
            dist.all_reduce(totals)
        self._loss_sum.zero_()
        self._loss_count = 0
        return float(totals[0] / totals[1])

    def _rate(self) -> float:
        """Samples per second over all ranks since the last call (or :meth:`restart_clock`)."""
        now, step = time.perf_counter(), self.parts.state.position.step
        since, steps_then = self._last_log
        self._last_log = (now, step)
        self.rate_steps = step - steps_then
        return self.rate_steps * self.config.global_batch_size / max(now - since, 1e-9)

    def _write_step_line(self) -> None:
        """Rank 0's `step` line in metrics.jsonl and its log line; kept, written or not."""
        p = self.parts.state.position
        self.last_step_line = dict(
            time=round(time.time(), 3),
            step=p.step,
            epoch=p.epoch,
            samplesInEpoch=p.samples_in_epoch,
            loss=self.last_loss,
            lr=self.lr,
            gradNorm=self.grad_norm,
            skippedSteps=self.skipped_steps,
            samplesPerSecond=round(self.last_rate, 3),
            rateSteps=self.rate_steps,
            **self._shape(),
            rank=self.env.rank,
            attempt=self.env.restart_count,
            **self.writer,
        )
        if not self.speaks:
            return
        self.line("step", **self.last_step_line)
        total, loss, rate = self.parts.total_steps, self.last_loss, self.last_rate
        log.info(STEP_LINE, p.step, total, p.epoch, loss, self.lr, rate, self.world)

    def catch_up(self) -> None:
        """PerStep mode, as this group becomes the writer: writes its last step line (with
        the time it was made) when the run log's newest step line is of an earlier step (the
        writer before did not commit it; :mod:`ddp_trainer.per_step.trainer`)."""
        kept = self.last_step_line
        if self.run_log is None or kept is None:
            return
        logged = self.run_log.last_step()
        if logged is None or logged < kept["step"]:
            self.run_log.write("step", **kept)

    def report(self, final: bool, urgent: bool = False) -> None:
        """Offers the progress record to the DDPJob's reporter (rank 0, in a cluster)."""
        if self.reporter is None or not self.speaks:
            return
        p, total, last = self.parts.state.position, self.parts.total_steps, self.checkpoints.last
        record = progress_record(
            epoch=p.epoch,
            step=p.step,
            total_steps=total,
            loss=self.last_loss,
            samples_per_second=self.last_rate,
            last_checkpoint=last,
            world_size=self.world,
            now=time.time(),
            held_at_step=self.held_at,
            groups=self.groups,
        )
        self.told = True
        self.reporter.offer(record, final=final, urgent=urgent)

    def checkpoint(self, step: int, blocked_s: float, synchronous: bool) -> None:
        """Rank 0 took a checkpoint of ``step``; training waited ``blocked_s`` for it."""
        self.line(
            "checkpoint",
            step=step,
            name=checkpoint_name(step),
            blockedMs=round(blocked_s * 1000, 3),
            synchronous=synchronous,
            rank=self.env.rank,
        )

    def held(self, step: int, release: Path, at_end: bool) -> None:
        """The run holds after ``step`` until ``release`` exists (reported at once)."""
        self.held_at = step
        if self.run_log is not None:
            self.line("hold", step=step, release=release.name)
            if at_end:
                log.info("training complete; holding until %s exists", release)
            else:
                log.info("holding after step %d until %s exists", step, release)
        self.report(final=False, urgent=True)

    def released(self, step: int, at_end: bool) -> None:
        self.held_at = None
        if self.run_log is not None:
            self.line("release", step=step)
            if not at_end:
                log.info("released at step %d", step)
        if not at_end:
            self.report(final=False, urgent=True)
            self.restart_clock()

    def close(self) -> None:
        """The final report (unless it waits on a start that told nothing), then no more lines."""
        if self.reporter is not None:
            if self.told or self.untold_final:
                self.report(final=True)
            self.reporter.close()
        if self.run_log is not None:
            self.run_log.close()
            self.run_log = None


STEP_LINE = "step %d/%d epoch %d loss %.4f lr %.3g %.1f samples/s world %d"


def run_shape(
    world: int, global_batch: int, count: int, micro: int, groups: int | None
) -> dict[str, Any]:
    """The shape fields of a ``start`` and ``step`` line (``groups``: PerStep mode only)."""
    shape = {
        "worldSize": world,
        "globalBatchSize": global_batch,
        "perRankBatch": count,
        "accumulation": micro,
    }
    return shape if groups is None else {**shape, "groups": groups}


def _start_fields(
    p: Position, parts: Parts, shape: dict[str, Any], resumed_from: str | None, e: DistEnv
) -> dict[str, Any]:
    """The fields of a ``start`` line (the field order is the line's)."""
    return {
        "step": p.step,
        "epoch": p.epoch,
        "samplesInEpoch": p.samples_in_epoch,
        "totalSteps": parts.total_steps,
        "stepsPerEpoch": parts.per_epoch,
        **shape,
        "amp": parts.precision.label,
        "device": str(parts.device),
        "resumedFrom": resumed_from,
        "rank": e.rank,
        "attempt": e.restart_count,
    }


def _log_start(config: TrainerConfig, e: DistEnv, parts: Parts, groups: int | None) -> None:
    """The run's shape; in PerStep mode (``groups``) each step's quorum splits the global batch,
    so a rank's share is the one of a full-strength job's, and grows with fewer groups."""
    split = (
        f"{e.world_size} ranks x {parts.batches.count}"
        if groups is None
        else f"split each step over the quorum's groups ({groups} now, of {e.world_size} ranks"
        f" each), {parts.batches.count} per rank at full strength"
    )
    log.info(
        "training %s: %d steps (%d per epoch), global batch %d = %s (x%d micro-batches), amp %s"
        " on %s",
        config.workload,
        parts.total_steps,
        parts.per_epoch,
        config.global_batch_size,
        split,
        parts.batches.accumulation_steps,
        parts.precision.label,
        parts.device,
    )


def _log_resumed(resumed_from: str | None, p: Position, saved_world: int, world: int) -> None:
    log.info(
        "resumed from %s: step %d, epoch %d, %d samples into the epoch (saved at world "
        "size %d, now %d)",
        resumed_from,
        p.step,
        p.epoch,
        p.samples_in_epoch,
        saved_world,
        world,
    )


def _log_non_finite(step: int, grad_norm: float, in_row: int, limit: int, skipped: int) -> None:
    log.warning(
        "step %d: the loss or gradient is not finite (gradient norm %s): optimizer step "
        "skipped (%d in a row, at most trainer.maxNonFiniteSteps=%d; %d in this process)",
        step,
        grad_norm,
        in_row,
        limit,
        skipped,
    )
