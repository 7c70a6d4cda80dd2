"""Checkpointing a run: global rank 0 writes checkpoints of the Stateful parts (in the background
between steps, waiting for the write at the end), and every rank resumes from the one rank 0
picks. The folder, its files and their checks are :mod:`ddp_trainer.state.store`'s."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import torch.distributed as dist

from ddp_api.trainer_config import TrainerConfig
from ddp_trainer.distributed import DistEnv
from ddp_trainer.reporting.prometheus import TrainerMetrics
from ddp_trainer.state import store as ckpt
from ddp_trainer.state.train_state import Stateful, scatter
from ddp_trainer.state.writer import AsyncCheckpointWriter, snapshot

log = logging.getLogger("ddp_trainer.trainer")  # the trainer's lines: people and tests grep them


def about_run(config: TrainerConfig, env: DistEnv) -> dict[str, Any]:
    """What a checkpoint says of the run besides its parts' states: its settings, its world,
    and who wrote it when."""
    return {
        "config": config.to_json_dict(),
        "worldSize": env.world_size,
        "globalBatchSize": config.global_batch_size,
        "writer": {"rank": env.rank, "pid": os.getpid(), "host": socket.gethostname()},
        "time": time.time(),
    }


class Saved(NamedTuple):
    """A checkpoint that rank 0 wrote, or handed to the background writer."""

    blocked_s: float  # how long training waited for it
    synchronous: bool  # written before training went on


class Checkpoints:
    """The run's checkpoints: rank 0 writes them; every rank resumes from the same one.

    A step counts as saved only once its checkpoint is on disk. A background write that fails is
    logged and counted (``ddp_trainer_checkpoint_failures_total``) and does not stop training;
    the next save is then written synchronously, and so are the SIGTERM and final ones."""

    def __init__(
        self,
        directory: Path,
        keep: int,
        env: DistEnv,
        metrics: TrainerMetrics,
        distributed: bool,
    ):
        self.env, self.metrics, self.distributed = env, metrics, distributed
        self.store = ckpt.CheckpointStore(directory, keep=keep)
        self.writer = (
            AsyncCheckpointWriter(self.store, on_written=self._written, on_failed=self._failed)
            if env.rank == 0
            else None
        )
        self.resumed_from: str | None = None
        self.saved_step = -1  # the newest step whose checkpoint is on disk (or resumed from)
        self.failed_step: int | None = None  # a background write failed; none succeeded since

    @property
    def last(self) -> str | None:
        """The newest checkpoint on disk: the last one written, else the one resumed from."""
        return self.writer.last.name if self.writer and self.writer.last else self.resumed_from

    def resume(
        self,
        parts: Mapping[str, Stateful],
        accept: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any] | None:
        """Loads the newest complete checkpoint into ``parts``, the same one on every rank (rank 0
        picks); returns what it held (None: there is none, the run starts afresh). A checkpoint
        that cannot be read raises (:class:`~ddp_trainer.state.store.UnreadableCheckpoint`): the
        worker fails rather than resume from an older one. ``accept`` sees the checkpoint first
        and raises to refuse it (nothing is loaded then)."""
        found = None
        if self.env.rank == 0:
            self.store.remove_temporaries()
            found = self.store.latest()
        chosen = [found[0] if found else None]
        if self.distributed:
            dist.broadcast_object_list(chosen, src=0)
        entry = chosen[0]
        if entry is None:
            return None
        state = found[1] if found else self.store.read(entry)
        del found  # rank 0 holds the state once, under one name
        if accept is not None:
            accept(state)
        scatter(state, parts)
        self.resumed_from = entry.name
        self.saved_step = entry.step
        return state

    def save(self, step: int, contents: Callable[[], dict[str, Any]], wait: bool) -> Saved | None:
        """Rank 0 writes ``contents()`` as the checkpoint of ``step``; returns how long training
        was blocked: only for the copy to CPU unless the write is synchronous (``wait``, or the
        previous background write failed). None: nothing written (not rank 0, ``step`` is on disk
        already, or a write standing in for a failed background one failed too: that is counted
        like one, and the next save tries again). A ``wait`` write that fails raises."""
        if self.writer is None:
            self.saved_step = step  # every rank knows which steps are saved
            return None
        started = time.perf_counter()
        self.writer.wait()  # the write in flight is on disk, or has failed
        if self.saved_step >= step:
            return None
        synchronous = wait or self.failed_step is not None
        if wait:
            self._write_now(step, contents)
        elif synchronous:
            log.warning(
                "writing step %d synchronously: the background write of step %d failed",
                step,
                self.failed_step,
            )
            try:
                self._write_now(step, contents)
            except Exception as error:
                self._failed(step, error)
                return None
        else:
            self.writer.submit(step, snapshot(contents()))
        blocked = time.perf_counter() - started
        self.metrics.checkpoint_blocked(blocked)
        return Saved(blocked, synchronous)

    def _write_now(self, step: int, contents: Callable[[], dict[str, Any]]) -> None:
        assert self.writer is not None
        writing = time.perf_counter()
        entry = self.store.write(step, contents())
        self.writer.last = entry
        seconds = time.perf_counter() - writing
        log.info("checkpoint %s written (synchronously, in %.2fs)", entry.name, seconds)
        self._written(entry, seconds)

    def _written(self, entry: ckpt.Entry, seconds: float) -> None:
        """A checkpoint is on disk (in the writer thread for background ones)."""
        self.saved_step = max(self.saved_step, entry.step)
        self.failed_step = None
        self.metrics.checkpoint_written(step=entry.step, seconds=seconds, size=entry.size)

    def _failed(self, step: int, error: BaseException) -> None:
        """A checkpoint write failed (in the writer thread for background ones)."""
        self.failed_step = step
        self.metrics.checkpoint_failed()
        log.error(
            "writing the checkpoint of step %d failed: %r; training goes on, the newest on disk "
            "is %s, and the next checkpoint is written synchronously",
            step,
            error,
            self.last or "none",
        )

    def mark_complete(self, step: int) -> None:
        """Rank 0 records that the run is complete once its final checkpoint is on disk."""
        if self.writer is not None:
            self.writer.wait()
            self.store.mark_complete(self.env.run_id, step, self.last)

    def close(self) -> None:
        """Waits for the write in flight (one that fails is logged and counted)."""
        if self.writer is not None:
            self.writer.close()
