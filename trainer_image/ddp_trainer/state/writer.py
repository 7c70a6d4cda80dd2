"""Checkpoints written in the background: training waits only for the copy of its state to CPU
(:func:`snapshot`); a thread writes it to the :class:`~ddp_trainer.state.store.CheckpointStore`."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from ddp_trainer.state.store import CheckpointStore, Entry

log = logging.getLogger("ddp_trainer.checkpoint")


def snapshot(value: Any) -> Any:
    """A copy of nested dicts/lists with every tensor cloned to CPU (safe to write later)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: snapshot(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(snapshot(v) for v in value)
    return value


class AsyncCheckpointWriter:
    """Writes snapshots in a background thread so training waits only for the copy.

    At most one write is in flight: submitting while one runs first waits for it. After each
    write, in the writer thread, ``on_written(entry, seconds)`` is called when it is on disk and
    ``on_failed(step, error)`` when it failed (logged here without one); a failed write is not
    raised later, so that it never stops training by itself. An error a callback raises is
    logged.
    """

    def __init__(
        self,
        store: CheckpointStore,
        on_written: Callable[[Entry, float], None] | None = None,
        on_failed: Callable[[int, BaseException], None] | None = None,
    ):
        self.store = store
        self.on_written = on_written
        self.on_failed = on_failed
        self.last: Entry | None = None  # the newest checkpoint on disk that this writer wrote
        self.last_write_s = 0.0
        self._jobs: queue.Queue[tuple[int, dict[str, Any]] | None] = queue.Queue(maxsize=1)
        self._idle = threading.Event()
        self._idle.set()
        self._thread = threading.Thread(target=self._run, name="checkpoint-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            step, state = job
            del job
            started = time.perf_counter()
            try:
                written = self.store.write(step, state)
            except BaseException as error:
                self._report_failure(step, error)
            else:
                self.last = written
                self.last_write_s = time.perf_counter() - started
                log.info("checkpoint %s written", written.name)
                if self.on_written is not None:
                    try:
                        self.on_written(written, self.last_write_s)
                    except Exception:
                        log.exception("on_written failed after checkpoint %s", written.name)
            del state  # the snapshot's memory goes before the next one is copied
            self._idle.set()

    def _report_failure(self, step: int, error: BaseException) -> None:
        if self.on_failed is None:
            log.error("writing the checkpoint of step %d failed: %r", step, error)
            return
        try:
            self.on_failed(step, error)
        except Exception:
            log.exception("on_failed failed after checkpoint of step %d", step)

    def wait(self) -> None:
        """Block until no write is in flight."""
        self._idle.wait()

    def submit(self, step: int, state: dict[str, Any]) -> None:
        self.wait()
        self._idle.clear()
        self._jobs.put((step, state))

    def close(self) -> None:
        self.wait()
        self._jobs.put(None)
        self._thread.join()
