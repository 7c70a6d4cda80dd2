"""Checkpoints: global rank 0 writes `step-NNNNNNNN.pt` atomically; a manifest names them.

Layout of the checkpoint folder::

    manifest.json           {"format": 1, "latest": "step-00000120.pt", "checkpoints": [...]}
    step-00000100.pt        one file per checkpoint (torch.save of a dict of plain types)
    step-00000120.pt
    metrics.jsonl           progress lines (see ddp_trainer.progress)
    complete.json           {"runId": "<job uid>", "step": 140, "checkpoint": "step-00000140.pt"}:
                            training of that run is complete (rank 0, after the final checkpoint)

A checkpoint is written to a temporary file in the same folder, fsynced, renamed into
place, and only then recorded (with its size and SHA-256) in the manifest, which is
replaced the same way. Readers take the newest entry that exists, matches its checksum
and loads; a torn or corrupt newest checkpoint is skipped in favour of the previous one.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
COMPLETE = "complete.json"
FORMAT = 1
_NAME = re.compile(r"^step-(\d{8,})\.pt$")
_TEMP_SUFFIX = ".tmp"


def checkpoint_name(step: int) -> str:
    """File name of the checkpoint taken after `step` optimizer steps."""
    return f"step-{step:08d}.pt"


def step_of(name: str) -> int | None:
    """The step in a checkpoint file name, or None for any other name."""
    match = _NAME.match(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class Entry:
    """One complete checkpoint as the manifest records it."""

    name: str
    step: int
    sha256: str | None = None
    size: int | None = None


def parse_manifest(text: str) -> list[Entry]:
    """Entries of a manifest, oldest first; ValueError when it is not a manifest."""
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError("not a ddp_trainer manifest (format 1)")
    entries = []
    for item in data.get("checkpoints", []):
        name = item["name"]
        step = step_of(name)
        if step is None or step != item["step"]:
            raise ValueError(f"bad manifest entry {item!r}")
        entries.append(Entry(name, step, item.get("sha256"), item.get("size")))
    return sorted(entries, key=lambda e: e.step)


def render_manifest(entries: Iterable[Entry]) -> str:
    """Manifest text for `entries`; `latest` names the newest one."""
    ordered = sorted(entries, key=lambda e: e.step)
    data = {
        "format": FORMAT,
        "latest": ordered[-1].name if ordered else None,
        "checkpoints": [asdict(e) for e in ordered],
    }
    return json.dumps(data, indent=1) + "\n"


def record(entries: list[Entry], new: Entry, keep: int) -> tuple[list[Entry], list[Entry]]:
    """(kept, removed) after recording `new`.

    Entries at or after the new step belong to a future that a resume discarded (for
    example a corrupt checkpoint that was skipped), so they go too.
    """
    history = [e for e in entries if e.step < new.step] + [new]
    kept = history[-keep:]
    stale = [e for e in entries if e.step >= new.step and e.name != new.name]
    return kept, history[:-keep] + stale


def candidates(entries: list[Entry], names_on_disk: Iterable[str]) -> list[Entry]:
    """Checkpoints to try, newest first.

    Files on disk that the manifest does not list (a crash between the rename and the
    manifest update) are candidates too; they are verified by loading them.
    """
    listed = {e.name for e in entries}
    extra = [
        Entry(name, step)
        for name in names_on_disk
        if (step := step_of(name)) is not None and name not in listed
    ]
    return sorted([*entries, *extra], key=lambda e: e.step, reverse=True)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes | memoryview) -> None:
    temp = path.with_name(f".{path.name}.{os.getpid()}{_TEMP_SUFFIX}")
    with open(temp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)
    _fsync_dir(path.parent)


@dataclass(frozen=True)
class Completion:
    """The record that training of one run is complete."""

    run_id: str  # torchrun's rendezvous id (TORCHELASTIC_RUN_ID): the DDPJob's uid
    step: int
    checkpoint: str | None


def read_completion(directory: Path | str) -> Completion | None:
    """The completion record of a checkpoint folder; None when there is none (or it is torn)."""
    try:
        data = json.loads((Path(directory) / COMPLETE).read_text())
        return Completion(str(data["runId"]), int(data["step"]), data.get("checkpoint"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        log.warning("ignoring unreadable %s in %s: %s", COMPLETE, directory, error)
        return None


class CheckpointStore:
    """The checkpoint folder: writing (global rank 0 only), choosing and loading."""

    def __init__(self, directory: Path | str, keep: int = 3):
        self.directory = Path(directory)
        self.keep = keep

    def entries(self) -> list[Entry]:
        """The manifest's entries; [] when it is missing or unreadable."""
        path = self.directory / MANIFEST
        try:
            return parse_manifest(path.read_text())
        except FileNotFoundError:
            return []
        except (OSError, ValueError, KeyError, TypeError) as error:
            log.warning("ignoring unreadable manifest %s: %s", path, error)
            return []

    def write(self, step: int, state: dict[str, Any]) -> Entry:
        """Write a checkpoint atomically, record it in the manifest and prune old ones."""
        self.directory.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        torch.save(state, buffer)
        data = buffer.getbuffer()
        name = checkpoint_name(step)
        _write_atomic(self.directory / name, data)
        entry = Entry(name, step, hashlib.sha256(data).hexdigest(), len(data))
        kept, removed = record(self.entries(), entry, self.keep)
        _write_atomic(self.directory / MANIFEST, render_manifest(kept).encode())
        for old in removed:
            (self.directory / old.name).unlink(missing_ok=True)
        return entry

    def mark_complete(self, run_id: str, step: int, checkpoint: str | None) -> None:
        """Records, atomically, that training of ``run_id`` is complete (global rank 0, once its
        final checkpoint is written)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        record = {"runId": run_id, "step": step, "checkpoint": checkpoint, "time": time.time()}
        _write_atomic(self.directory / COMPLETE, (json.dumps(record) + "\n").encode())

    def remove_temporaries(self) -> None:
        """Delete temporary files a killed writer left behind (call before writing starts)."""
        for path in self.directory.glob(f".*{_TEMP_SUFFIX}"):
            path.unlink(missing_ok=True)

    def load(self, entry: Entry) -> dict[str, Any]:
        """Verify and load one checkpoint; raises on a missing, torn or corrupt file."""
        data = (self.directory / entry.name).read_bytes()
        if entry.size is not None and len(data) != entry.size:
            raise ValueError(f"size {len(data)} != {entry.size} recorded in the manifest")
        if entry.sha256 is not None and hashlib.sha256(data).hexdigest() != entry.sha256:
            raise ValueError("SHA-256 differs from the manifest")
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise ValueError("not a ddp_trainer checkpoint")
        return state

    def latest(self) -> tuple[Entry, dict[str, Any]] | None:
        """The newest checkpoint that loads, skipping corrupt ones; None when there is none."""
        if not self.directory.is_dir():
            return None
        names = [p.name for p in self.directory.iterdir()]
        for entry in candidates(self.entries(), names):
            try:
                return entry, self.load(entry)
            except Exception as error:
                log.warning("skipping checkpoint %s: %s", entry.name, error)
        return None


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

    At most one write is in flight: submitting while one runs first waits for it.
    ``on_written(entry, seconds)`` is called in the writer thread after each complete write;
    an error it raises is logged, never taken for a failed write.
    """

    def __init__(
        self,
        store: CheckpointStore,
        on_written: Callable[[Entry, float], None] | None = None,
    ):
        self.store = store
        self.on_written = on_written
        self.last: Entry | None = None
        self.last_write_s = 0.0
        self._jobs: queue.Queue[tuple[int, dict[str, Any]] | None] = queue.Queue(maxsize=1)
        self._idle = threading.Event()
        self._idle.set()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="checkpoint-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            step, state = job
            started = time.perf_counter()
            written = None
            try:
                written = self.last = self.store.write(step, state)
                log.info("checkpoint %s written", written.name)
            except BaseException as error:
                self._error = error
            self.last_write_s = time.perf_counter() - started
            if written is not None and self.on_written is not None:
                try:
                    self.on_written(written, self.last_write_s)
                except Exception:
                    log.exception("on_written failed after checkpoint %s", written.name)
            self._idle.set()

    def wait(self) -> None:
        """Block until no write is in flight; re-raise a failed write's error."""
        self._idle.wait()
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError("writing a checkpoint failed") from error

    def submit(self, step: int, state: dict[str, Any]) -> None:
        self.wait()
        self._idle.clear()
        self._jobs.put((step, state))

    def close(self) -> None:
        self.wait()
        self._jobs.put(None)
        self._thread.join()


def load_for_inference(path: str | os.PathLike[str]) -> torch.nn.Module:
    """The trained model as a plain module on CPU in eval mode, ready for inference.

    `path` is a checkpoint folder (its newest complete checkpoint is used) or one
    checkpoint file. The model is rebuilt from the settings stored in the checkpoint;
    its weights carry no DDP `module.` prefix.
    """
    from ddp_api.trainer_config import TrainerConfig

    from .workloads import build_model

    target = Path(path)
    if target.is_dir():
        found = CheckpointStore(target).latest()
        if found is None:
            raise FileNotFoundError(f"no complete checkpoint in {target}")
        state = found[1]
    else:
        state = CheckpointStore(target.parent).load(Entry(target.name, step_of(target.name) or 0))
    config = TrainerConfig.model_validate(state["config"])
    model = build_model(config)
    model.load_state_dict(state["model"])
    return model.eval()
