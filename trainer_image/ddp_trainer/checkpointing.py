"""Checkpointing a run: global rank 0 writes checkpoints of the Stateful parts (in the background
between steps, waiting for the write at the end), and every rank resumes from the one rank 0
picks. The folder, its files and their checks are :mod:`ddp_trainer.checkpoint`'s."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch.distributed as dist

from ddp_api.trainer_config import TrainerConfig

from . import checkpoint as ckpt
from .distributed import DistEnv
from .metrics import TrainerMetrics
from .state import Stateful, scatter

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


class Checkpoints:
    """The run's checkpoints: rank 0 writes them; every rank resumes from the same one."""

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
            ckpt.AsyncCheckpointWriter(self.store, on_written=self._written)
            if env.rank == 0
            else None
        )
        self.resumed_from: str | None = None
        self.saved_step = -1  # the newest step checkpointed (or resumed from)

    @property
    def last(self) -> str | None:
        """The newest checkpoint's name: the last one written, else the one resumed from."""
        return self.writer.last.name if self.writer and self.writer.last else self.resumed_from

    def resume(
        self,
        parts: Mapping[str, Stateful],
        accept: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any] | None:
        """Loads the newest complete checkpoint into ``parts``, the same one on every rank (rank 0
        picks); returns what it held (None: there is none, the run starts afresh). ``accept``
        sees the checkpoint first and raises to refuse it (nothing is loaded then)."""
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
        state = found[1] if found else self.store.load(entry)
        if accept is not None:
            accept(state)
        scatter(state, parts)
        self.resumed_from = entry.name
        self.saved_step = entry.step
        return state

    def save(self, step: int, contents: Callable[[], dict[str, Any]], wait: bool) -> float | None:
        """Rank 0 writes ``contents()`` as the checkpoint of ``step`` and returns how long training
        was blocked: only for the copy to CPU unless ``wait`` is set (None on other ranks)."""
        if self.writer is None:
            self.saved_step = step  # every rank knows which steps are saved
            return None
        started = time.perf_counter()
        if wait:
            self.writer.wait()
            writing = time.perf_counter()
            entry = self.store.write(step, contents())
            self.writer.last = entry
            self._written(entry, time.perf_counter() - writing)
        else:
            self.writer.submit(step, ckpt.snapshot(contents()))
        self.saved_step = step
        blocked = time.perf_counter() - started
        self.metrics.checkpoint_blocked(blocked)
        return blocked

    def _written(self, entry: ckpt.Entry, seconds: float) -> None:
        self.metrics.checkpoint_written(step=entry.step, seconds=seconds, size=entry.size)

    def mark_complete(self, step: int) -> None:
        """Rank 0 records that the run is complete once its final checkpoint is on disk."""
        if self.writer is not None:
            self.writer.wait()
            self.store.mark_complete(self.env.run_id, step, self.last)

    def close(self) -> None:
        """Waits for the write in flight; a failed one is logged (training is over)."""
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception:
                log.exception("a background checkpoint write failed")
