"""How a run ends: complete (the final checkpoint, the completion record, rank 0's evaluation, a
hold at the last step), interrupted by SIGTERM (rank 0 checkpoints the step, exit 143), or failed
(rank 0 keeps a consistent step it holds before the error goes on)."""

from __future__ import annotations

import logging
import signal
import time
from typing import TYPE_CHECKING

import torch.distributed as dist

from ddp_trainer import hold
from ddp_trainer.data.workloads import evaluate

if TYPE_CHECKING:
    from ddp_trainer.trainer import Trainer

log = logging.getLogger("ddp_trainer.trainer")  # the trainer's lines: people and tests grep them

EXIT_INTERRUPTED = 128 + signal.SIGTERM
# Not a crash that a restart may cure: torchrun still restarts the workers (up to
# maxRestarts, each resuming from the newest checkpoint and failing alike), then the pod fails.
EXIT_NON_FINITE = 3


class Interrupted(Exception):
    """SIGTERM arrived (here, or on a peer): every rank stops after the same step."""


class NonFiniteSteps(Exception):
    """Too many steps in a row had a non-finite loss or gradient (trainer.maxNonFiniteSteps)."""


def too_many_non_finite(in_row: int, limit: int, step: int) -> NonFiniteSteps | None:
    """The failure after ``in_row`` consecutive non-finite steps, the last one ``step`` (None:
    training goes on); ``limit`` is trainer.maxNonFiniteSteps (0: never)."""
    if not limit or in_row < limit:
        return None
    return NonFiniteSteps(
        f"{in_row} consecutive steps with a non-finite loss or gradient at step {step}: lower "
        "lr, enable gradClipNorm, or raise trainer.maxNonFiniteSteps"
    )


def interrupted(trainer: Trainer, why: Interrupted) -> int:
    """Rank 0 checkpoints the step training stopped at (unless it has); returns 143."""
    log.warning("%s: stopping at step %d", str(why) or "SIGTERM", trainer.position.step)
    # Every rank stopped after this same step (the step's agreement, or a hold's), so every
    # rank sends its generators for the checkpoint; a peer that is gone fails the gather (within
    # the collective timeout) and the checkpoint then holds rank 0's generators only.
    try:
        trainer.parts.state.collect_rng(trainer.distributed)
    except Exception as error:
        log.warning("could not gather every rank's random generators: %s", error)
    if trainer.position.step > trainer.checkpoints.saved_step:
        trainer.save_checkpoint(wait=True, every_rank=False)  # gathered above
    trainer.close()
    return EXIT_INTERRUPTED


def diverged(trainer: Trainer, why: NonFiniteSteps) -> int:
    """Every rank fails alike with the reason; nothing is saved, so a restart replays these
    steps from the newest checkpoint instead of skipping past them. Returns 3."""
    log.error("training failed: %s", why)
    trainer.close()
    return EXIT_NON_FINITE


def save_after_failure(trainer: Trainer) -> None:
    """A peer died mid-step: rank 0 still holds a consistent state, so keep it."""
    step = trainer.position.step
    if trainer.is_main and trainer.consistent and step > trainer.checkpoints.saved_step:
        try:
            log.warning("a step failed; saving step %d before exiting", step)
            trainer.save_checkpoint(wait=True, every_rank=False)  # the peers may be gone
        except Exception:
            log.exception("could not save a checkpoint after the failure")
    trainer.close()


def finish(trainer: Trainer) -> int:
    """Training is complete: the final checkpoint, then the completion record, evaluation, the
    ``end`` line, the last barrier and a hold at the last step; returns 0."""
    t, p, config = trainer, trainer.parts, trainer.config
    if t.position.step > t.checkpoints.saved_step:
        t.save_checkpoint(wait=True)
    t.checkpoints.mark_complete(t.position.step)  # once the final checkpoint is on disk
    # Rank 0 evaluates alone while the others wait at the barrier below.
    t.timeout.set(config.pg_timeout_s)
    results: dict[str, float] = {}
    if t.is_main and config.evaluate and p.test_set is not None:
        batch, batches = config.global_batch_size, config.eval_max_batches
        results = evaluate(
            p.model, p.test_set, p.loss_fn, batch, batches, p.device, p.count_targets
        )
        log.info("evaluation: %s", results)
    pos, e = t.position, t.env
    t.tally.line(
        "end", step=pos.step, epoch=pos.epoch, worldSize=e.world_size, rank=e.rank, **results
    )
    if t.distributed:
        dist.barrier()
    hold_at_end(t)
    t.close()
    return 0


def hold_at_end(trainer: Trainer) -> None:
    """A hold at the last step (:mod:`ddp_trainer.hold`): each rank waits on its own, as the
    collectives are over and a peer may be gone; SIGTERM ends the wait."""
    step, folder = trainer.position.step, trainer.checkpoints.store.directory
    if not hold.holds_at_end(step, trainer.config.hold_at_steps, trainer.parts.total_steps):
        return
    if hold.is_released(folder, step):
        return
    trainer.tally.held(step, folder / hold.release_name(step), at_end=True)
    while not hold.is_released(folder, step) and not trainer.stop_requested.is_set():
        time.sleep(hold.POLL_S)
    trainer.tally.released(step, at_end=True)
