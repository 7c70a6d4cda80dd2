"""How a run ends: complete (the final checkpoint, the completion record, rank 0's evaluation, the
ranks ending together, a hold at the last step), interrupted by SIGTERM (rank 0 checkpoints the
step, exit 143), or failed (rank 0 keeps a consistent step it holds before the error goes on)."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path
from threading import Event

from ddp_api.trainer_config import TrainerConfig
from ddp_trainer import hold
from ddp_trainer.data.workloads import evaluate
from ddp_trainer.distributed import DistEnv, Interrupted
from ddp_trainer.end_together import Beats, end_store, end_together
from ddp_trainer.parts import Parts
from ddp_trainer.reporting.tally import Tally
from ddp_trainer.state.checkpoints import Checkpoints
from ddp_trainer.step import NonFiniteSteps

log = logging.getLogger("ddp_trainer.trainer")  # the trainer's lines: people and tests grep them

EXIT_INTERRUPTED = 128 + signal.SIGTERM
# Not a crash that a restart may cure: torchrun still restarts the workers (up to
# maxRestarts, each resuming from the newest checkpoint and failing alike), then the pod fails.
EXIT_NON_FINITE = 3


def interrupted(
    why: Interrupted,
    parts: Parts,
    checkpoints: Checkpoints,
    distributed: bool,
    save: Callable[[], None],
) -> int:
    """Rank 0 checkpoints the step training stopped at (unless it has: ``save`` writes it,
    waiting, with the generators gathered here); returns 143."""
    step = parts.state.position.step
    log.warning("%s: stopping at step %d", str(why) or "SIGTERM", step)
    # Every rank stopped after this same step (the step's agreement, or a hold's), so every
    # rank sends its generators for the checkpoint; a peer that is gone fails the gather (within
    # the collective timeout) and the checkpoint then holds rank 0's generators only.
    try:
        parts.state.collect_rng(distributed)
    except Exception as error:
        log.warning("could not gather every rank's random generators: %s", error)
    if step > checkpoints.saved_step:
        save()
    return EXIT_INTERRUPTED


def diverged(why: NonFiniteSteps) -> int:
    """Every rank fails alike with the reason; nothing is saved, so a restart replays these
    steps from the newest checkpoint instead of skipping past them. Returns 3."""
    log.error("training failed: %s", why)
    return EXIT_NON_FINITE


def save_after_failure(
    step: int, writes: bool, consistent: bool, saved_step: int, save: Callable[[], None]
) -> None:
    """A peer died mid-step: the process that writes checkpoints (``writes``) still holds a
    consistent state (``consistent``: that of ``step``), so ``save`` keeps it."""
    if writes and consistent and step > saved_step:
        try:
            log.warning("a step failed; saving step %d before exiting", step)
            save()  # the peers may be gone: rank 0's generators only
        except Exception:
            log.exception("could not save a checkpoint after the failure")


def finish(
    config: TrainerConfig,
    env: DistEnv,
    parts: Parts,
    checkpoints: Checkpoints,
    tally: Tally,
    evaluates: bool,
    distributed: bool,
    save: Callable[[], None],
    stop_requested: Event,
) -> None:
    """Training is complete: the final checkpoint (``save``, waiting), then the completion
    record, the evaluation (``evaluates``: rank 0, which writes both), the ``end`` line, and the
    ranks end together (:mod:`ddp_trainer.end_together`)."""
    p, pos = parts, parts.state.position
    store = end_store(env.run_id) if distributed else None
    results: dict[str, float] = {}
    with Beats(store if evaluates else None):
        if pos.step > checkpoints.saved_step:
            save()
        checkpoints.mark_complete(pos.step)  # once the final checkpoint is on disk
        if evaluates and config.evaluate and p.test_set is not None:
            batch, batches = config.global_batch_size, config.eval_max_batches
            results = evaluate(
                p.model, p.test_set, p.loss_fn, batch, batches, p.device, p.count_targets
            )
            log.info("evaluation: %s", results)
    tally.line(
        "end", step=pos.step, epoch=pos.epoch, worldSize=env.world_size, rank=env.rank, **results
    )
    if store is not None:
        others = env.world_size - 1
        end_together(store, evaluates, config.steady_timeout_s, stop_requested, others)


def hold_at_end(
    config: TrainerConfig, parts: Parts, folder: Path, tally: Tally, stop_requested: Event
) -> None:
    """A hold at the last step (:mod:`ddp_trainer.hold`; its release file in ``folder``): each
    rank waits on its own, as the collectives are over and a peer may be gone; SIGTERM
    (``stop_requested``) ends the wait."""
    step = parts.state.position.step
    if not hold.holds_at_end(step, config.hold_at_steps, parts.total_steps):
        return
    if hold.is_released(folder, step):
        return
    tally.held(step, folder / hold.release_name(step), at_end=True)
    while not hold.is_released(folder, step) and not stop_requested.is_set():
        time.sleep(hold.POLL_S)
    tally.released(step, at_end=True)
