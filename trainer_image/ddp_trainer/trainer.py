"""The training loop: DDP + AMP, exact resume from rank-0 checkpoints, checkpoint on SIGTERM."""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import threading
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from . import checkpoint as ckpt
from .amp import resolve_amp
from .config import TrainerConfig
from .plan import (
    Position,
    advance,
    plan_batches,
    settle,
    step_seed,
    steps_per_epoch,
    total_steps,
)
from .progress import MetricsLog, ProgressReporter, progress_patch
from .sampler import GlobalBatchSampler
from .schedule import lr_at, peak_lr
from .workloads import build_workload, evaluate, fetch_batch

log = logging.getLogger(__name__)

EXIT_INTERRUPTED = 128 + signal.SIGTERM


@dataclass(frozen=True)
class DistEnv:
    """Where this process stands, from the variables torchrun sets (alone: rank 0 of 1)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    restart_count: int = 0
    launched: bool = False  # started by torchrun: join a process group even when alone

    @classmethod
    def from_env(cls, environ: Any = None) -> DistEnv:
        environ = os.environ if environ is None else environ
        if "RANK" not in environ:
            return cls()
        return cls(
            rank=int(environ["RANK"]),
            local_rank=int(environ.get("LOCAL_RANK", 0)),
            world_size=int(environ.get("WORLD_SIZE", 1)),
            restart_count=int(environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
            launched=True,
        )


class Interrupted(Exception):
    """SIGTERM arrived: stop after the current step."""


def pick_device(setting: str, local_rank: int) -> torch.device:
    if setting == "cuda" or (setting == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("device: cuda was asked for but CUDA is not available")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch generator states, as types a weights-only load accepts."""
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": [
            name,
            torch.from_numpy(np.asarray(keys).astype(np.int64)),
            pos,
            has_gauss,
            cached,
        ],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Trainer:
    """One process of a (possibly single-process) DDP training run."""

    def __init__(self, config: TrainerConfig, checkpoint_dir: Path, env: DistEnv | None = None):
        self.config = config
        self.env = env or DistEnv.from_env()
        self.is_main = self.env.rank == 0
        self.distributed = dist.is_available() and dist.is_initialized()
        self.device = pick_device(config.device, self.env.local_rank)

        workload = build_workload(config)
        self.model = workload.model.to(self.device)
        self.train_set, self.test_set, self.loss_fn = (
            workload.train_set,
            workload.test_set,
            workload.loss_fn,
        )
        self.net: torch.nn.Module = self.model
        if self.distributed:
            self.net = DistributedDataParallel(
                self.model,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
                bucket_cap_mb=config.bucket_cap_mb,
                gradient_as_bucket_view=config.gradient_as_bucket_view,
                static_graph=config.static_graph,
            )
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=config.lr, weight_decay=config.weight_decay
        )
        bf16_ok = self.device.type == "cpu" or torch.cuda.is_bf16_supported()
        self.precision = resolve_amp(config.amp, self.device.type, bf16_ok)
        self.autocast_dtype = getattr(torch, self.precision.dtype) if self.precision.dtype else None
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision.grad_scaler)

        world = self.env.world_size
        self.global_batch = config.global_batch_size
        self.plan = plan_batches(self.global_batch, world, self.env.rank, config.micro_batch_size)
        self.num_samples = len(self.train_set)  # type: ignore[arg-type]
        self.per_epoch = steps_per_epoch(self.num_samples, self.global_batch)
        if self.per_epoch == 0:
            raise ValueError(
                f"globalBatchSize ({self.global_batch}) exceeds the training set "
                f"({self.num_samples} samples)"
            )
        self.total_steps = total_steps(config.epochs, self.per_epoch, config.max_steps)
        self.peak_lr = peak_lr(
            config.lr, self.global_batch, config.base_batch_size, config.scale_lr
        )
        self.sampler = GlobalBatchSampler(self.train_set, self.plan, seed=config.seed)  # type: ignore[arg-type]
        self.position = Position(step=0, epoch=0, samples_in_epoch=0)

        self.store = ckpt.CheckpointStore(checkpoint_dir, keep=config.checkpoint_keep)
        self.writer = ckpt.AsyncCheckpointWriter(self.store) if self.is_main else None
        self.metrics = MetricsLog(checkpoint_dir) if self.is_main else None
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

    # state -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything an exact resume needs, with plain-module (no `module.`) weights."""
        position = self.position
        return {
            "format": ckpt.FORMAT,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": {
                "kind": "warmup-cosine",
                "peakLr": self.peak_lr,
                "warmupSteps": self.config.warmup_steps,
                "totalSteps": self.total_steps,
                "minLr": self.config.min_lr,
                "nextStep": position.step,
            },
            "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else None,
            "step": position.step,
            "epoch": position.epoch,
            "samplesInEpoch": position.samples_in_epoch,
            "rng": rng_state(),
            "config": self.config.to_json_dict(),
            "worldSize": self.env.world_size,
            "globalBatchSize": self.global_batch,
            "writer": {"rank": self.env.rank, "pid": os.getpid(), "host": socket.gethostname()},
            "time": time.time(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if state.get("scaler") and self.scaler.is_enabled():
            self.scaler.load_state_dict(state["scaler"])
        set_rng_state(state["rng"])
        saved = Position(state["step"], state["epoch"], state["samplesInEpoch"])
        self.position = settle(saved, self.global_batch, self.num_samples)

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
        if self.writer is None or self.metrics is None:
            return
        started = time.perf_counter()
        step = self.position.step
        if wait:
            self.writer.wait()
            entry = self.store.write(step, self.state_dict())
            self.writer.last = entry
        else:
            self.writer.submit(step, ckpt.snapshot(self.state_dict()))
        self.saved_step = step
        blocked_ms = (time.perf_counter() - started) * 1000
        self.metrics.write(
            "checkpoint",
            step=step,
            name=ckpt.checkpoint_name(step),
            blockedMs=round(blocked_ms, 3),
            synchronous=wait,
            rank=self.env.rank,
        )

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
                weighted = loss * (len(indices) * scale)
                if self.scaler.is_enabled():
                    self.scaler.scale(weighted).backward()
                else:
                    weighted.backward()
            self._loss_sum += loss.detach().float() * len(indices)
            self._loss_count += len(indices)
        self._consistent = False
        if self.scaler.is_enabled():
            if self.config.grad_clip_norm:
                self.scaler.unscale_(self.optimizer)
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip_norm)
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            if self.config.grad_clip_norm:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip_norm)
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.position = advance(self.position, self.global_batch, self.num_samples)
        self._consistent = True

    def _log_progress(self) -> None:
        """Every rank joins the loss all-reduce; rank 0 writes, logs and reports."""
        totals = torch.stack(
            [self._loss_sum, torch.tensor(float(self._loss_count), device=self.device)]
        )
        if self.distributed:
            dist.all_reduce(totals)
        loss = float(totals[0] / totals[1])
        self._loss_sum.zero_()
        self._loss_count = 0
        now = time.perf_counter()
        since, steps_then = self._last_log
        rate = (self.position.step - steps_then) * self.global_batch / max(now - since, 1e-9)
        self._last_log = (now, self.position.step)
        self.last_loss, self.last_rate = loss, rate
        if not self.is_main or self.metrics is None:
            return
        p = self.position
        self.metrics.write(
            "step",
            step=p.step,
            epoch=p.epoch,
            samplesInEpoch=p.samples_in_epoch,
            loss=loss,
            lr=self.lr,
            samplesPerSecond=round(rate, 3),
            worldSize=self.env.world_size,
            globalBatchSize=self.global_batch,
            perRankBatch=self.plan.count,
            accumulation=self.plan.accumulation_steps,
            rank=self.env.rank,
            attempt=self.env.restart_count,
        )
        log.info(
            "step %d/%d epoch %d loss %.4f lr %.3g %.1f samples/s world %d",
            p.step,
            self.total_steps,
            p.epoch,
            loss,
            self.lr,
            rate,
            self.env.world_size,
        )
        self._report(final=False)

    def _report(self, final: bool) -> None:
        if self.reporter is None:
            return
        last = self.writer.last.name if self.writer and self.writer.last else self.resumed_from
        self.reporter.offer(
            progress_patch(
                epoch=self.position.epoch,
                step=self.position.step,
                total_steps=self.total_steps,
                loss=self.last_loss,
                samples_per_second=self.last_rate,
                last_checkpoint=last,
                world_size=self.env.world_size,
                now=time.time(),
            ),
            final=final,
        )

    # the run ---------------------------------------------------------------------------

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.stop_requested.set()

    def train(self) -> int:
        """Train to the end (exit code 0) or until SIGTERM (exit code 143)."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)
        self.resume()
        if self.metrics is not None:
            self.metrics.write(
                "start",
                step=self.position.step,
                epoch=self.position.epoch,
                samplesInEpoch=self.position.samples_in_epoch,
                totalSteps=self.total_steps,
                stepsPerEpoch=self.per_epoch,
                worldSize=self.env.world_size,
                globalBatchSize=self.global_batch,
                perRankBatch=self.plan.count,
                accumulation=self.plan.accumulation_steps,
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
            self.plan.count,
            self.plan.accumulation_steps,
            self.precision.label,
            self.device,
        )
        try:
            self._loop()
        except Interrupted:
            log.warning("SIGTERM: stopping at step %d", self.position.step)
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
                self._train_step(micro_batches)
                step = self.position.step
                if first or step % every_log == 0 or step == self.total_steps:
                    self._log_progress()
                    first = False
                if self.stop_requested.is_set():
                    raise Interrupted
                if every_ckpt and step % every_ckpt == 0 and step < self.total_steps:
                    self.save_checkpoint(wait=False)
                if step >= self.total_steps or self.position.samples_in_epoch == 0:
                    break

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
        if self.metrics is not None:
            self.metrics.write(
                "end",
                step=self.position.step,
                epoch=self.position.epoch,
                worldSize=self.env.world_size,
                rank=self.env.rank,
                **results,
            )
        self._close(final=True)
        if self.distributed:
            dist.barrier()
        return 0

    def _close(self, final: bool) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception:
                log.exception("a background checkpoint write failed")
        if self.reporter is not None:
            self._report(final=True)
            self.reporter.close()
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None


def init_distributed(env: DistEnv, config: TrainerConfig) -> None:
    """Join the process group torchrun prepared: NCCL on CUDA, gloo on CPU."""
    if not env.launched or dist.is_initialized():
        return
    use_cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    dist.init_process_group(
        backend="nccl" if use_cuda else "gloo",
        timeout=timedelta(seconds=config.pg_timeout_s),
    )


def run(config: TrainerConfig, checkpoint_dir: Path) -> int:
    """Train in this process (one of torchrun's workers, or alone); returns the exit code."""
    env = DistEnv.from_env()
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit():
        torch.set_num_threads(int(threads))
    init_distributed(env, config)
    trainer = Trainer(config, checkpoint_dir, env)
    code = trainer.train()
    if code == 0 and dist.is_initialized():
        dist.destroy_process_group()
    return code
