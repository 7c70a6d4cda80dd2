"""Checkpoints: global rank 0 writes `step-NNNNNNNN.pt` atomically; a manifest names them.

Layout of the checkpoint folder::

    manifest.json           {"format": 1, "latest": "step-00000120.pt", "checkpoints": [...]}
    step-00000100.pt        one file per checkpoint (torch.save of a dict of plain types)
    step-00000120.pt
    metrics.jsonl           progress lines (see ddp_trainer.reporting.run_log)
    complete.json           {"runId": "<job uid>", "step": 140, "checkpoint": "step-00000140.pt"}:
                            training of that run is complete (rank 0, after the final checkpoint)

A checkpoint is streamed to a temporary file in the same folder (hashed as it is written),
fsynced, renamed into place, and only then recorded (with its size and SHA-256) in the
manifest, which is replaced the same way.

Reading takes the newest checkpoint and tells three cases apart:

- *corrupt*: its size or SHA-256 differs from the manifest's, or (a file the manifest does not
  list: a crash between the rename and the manifest) it is not a ddp_trainer checkpoint or does
  not unpickle. It is skipped for the previous one, and the store remembers it: the next write
  drops it from the manifest and deletes it.
- *missing*: listed but absent. Skipped with a warning; nothing is deleted (if it comes back, a
  later resume finds it again).
- *unreadable*: reading raised any other OSError (EIO, a transient NFS error). It is retried
  (``read_retry_s``: 0.5, 1 and 2 s), then :class:`UnreadableCheckpoint` is raised: the resume
  fails loudly instead of going back to an older checkpoint. A file that matches its manifest
  entry but does not load fails the same way.

Loaded tensors are mapped from the file (``mmap``, private: copy-on-write), after its SHA-256
was checked a block at a time, so a load takes about the checkpoint's size in memory.

Retention (:func:`record`) deletes only checkpoints older than the one written, beyond the
newest ``keep``, and those verified corrupt: never a newer one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

log = logging.getLogger("ddp_trainer.checkpoint")

MANIFEST = "manifest.json"
COMPLETE = "complete.json"
FORMAT = 1
_NAME = re.compile(r"^step-(\d{8,})\.pt$")
_TEMP_SUFFIX = ".tmp"
READ_RETRY_S = (0.5, 1.0, 2.0)  # waits between tries of an unreadable checkpoint
T = TypeVar("T")
_BLOCK = 1 << 20  # bytes read at a time while a checkpoint's SHA-256 is checked


class CorruptCheckpoint(ValueError):
    """A checkpoint verified not to be what was written: skipped for the previous one."""


class UnreadableCheckpoint(RuntimeError):
    """A checkpoint that could not be read (after retries), or that matches its manifest entry
    and still does not load: the resume fails rather than fall back to an older one."""


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


def record(
    entries: list[Entry], new: Entry, keep: int, corrupt: Collection[Entry] = ()
) -> tuple[list[Entry], list[Entry]]:
    """(kept, removed) after recording `new`: the newest `keep` up to `new`, and any newer one.

    Only entries older than `new` are pruned, and those in `corrupt` (verified corrupt when a
    resume skipped them, listed or not); a newer entry stays whatever happened to it.
    """
    bad = {e.name for e in corrupt} - {new.name}
    sound = [e for e in entries if e.name not in bad and e.name != new.name]
    history = [e for e in sound if e.step < new.step] + [new]
    newer = [e for e in sound if e.step > new.step]
    return history[-keep:] + newer, history[:-keep] + [e for e in corrupt if e.name in bad]


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
    with _atomic(path) as f:
        f.write(data)


class _HashingFile:
    """A file being written that counts and hashes what goes through it."""

    def __init__(self, file: Any):
        self.file, self.size, self.sha256 = file, 0, hashlib.sha256()

    def write(self, data: bytes | memoryview) -> int:
        self.sha256.update(data)
        self.size += len(data)
        return int(self.file.write(data))

    def flush(self) -> None:
        self.file.flush()


class _atomic:
    """``with _atomic(path) as f``: write a temporary file, fsync it, rename it to ``path`` (and
    fsync the folder) only when the block ends without an error; else the temporary goes."""

    def __init__(self, path: Path):
        self.path = path
        self.temp = path.with_name(f".{path.name}.{os.getpid()}{_TEMP_SUFFIX}")

    def __enter__(self) -> _HashingFile:
        self.file = open(self.temp, "wb")  # closed in __exit__
        return _HashingFile(self.file)

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        try:
            if error is None:
                self.file.flush()
                os.fsync(self.file.fileno())
        finally:
            self.file.close()
        if error is not None:
            self.temp.unlink(missing_ok=True)
            return
        os.replace(self.temp, self.path)
        _fsync_dir(self.path.parent)


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

    def __init__(
        self, directory: Path | str, keep: int = 3, read_retry_s: Iterable[float] = READ_RETRY_S
    ):
        self.directory = Path(directory)
        self.keep = keep
        self.read_retry_s = tuple(read_retry_s)
        self.corrupt: dict[str, Entry] = {}  # found corrupt by latest(); gone at the next write

    def entries(self) -> list[Entry]:
        """The manifest's entries; [] when it is missing or torn. A manifest that cannot be read
        raises (after retries): pruning or choosing without it could lose a checkpoint."""
        path = self.directory / MANIFEST
        try:
            text = self._retrying(path, path.read_text)
        except FileNotFoundError:
            return []
        try:
            return parse_manifest(text)
        except (ValueError, KeyError, TypeError) as error:
            log.warning("ignoring unreadable manifest %s: %s", path, error)
            return []

    def write(self, step: int, state: dict[str, Any]) -> Entry:
        """Write a checkpoint atomically, record it in the manifest and prune old ones."""
        self.directory.mkdir(parents=True, exist_ok=True)
        name = checkpoint_name(step)
        with _atomic(self.directory / name) as f:
            torch.save(state, f)  # type: ignore[arg-type]
        entry = Entry(name, step, f.sha256.hexdigest(), f.size)
        kept, removed = record(self.entries(), entry, self.keep, self.corrupt.values())
        _write_atomic(self.directory / MANIFEST, render_manifest(kept).encode())
        for old in removed:
            (self.directory / old.name).unlink(missing_ok=True)
        self.corrupt.clear()
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
        """Verify and load one checkpoint, once: CorruptCheckpoint when it is verified corrupt,
        UnreadableCheckpoint when it matches the manifest and does not load, OSError when reading
        fails (FileNotFoundError: it is not there).

        The SHA-256 is checked a block at a time and the tensors are memory-mapped, so loading
        takes about the checkpoint's size in memory, not two or three times it."""
        path = self.directory / entry.name
        size, sha256 = _digest(path)
        if entry.size is not None and size != entry.size:
            raise CorruptCheckpoint(f"size {size} != {entry.size} recorded in the manifest")
        if entry.sha256 is not None and sha256 != entry.sha256:
            raise CorruptCheckpoint("SHA-256 differs from the manifest")
        verified = entry.sha256 is not None
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            if not isinstance(state, dict) or state.get("format") != FORMAT:
                raise ValueError("not a ddp_trainer checkpoint")
        except OSError:
            raise
        except Exception as error:
            if verified:  # exactly what was written: a newer format, or another torch's
                raise UnreadableCheckpoint(
                    f"{path} matches its manifest entry but does not load: {error}"
                ) from error
            raise CorruptCheckpoint(str(error)) from error
        return state

    def read(self, entry: Entry) -> dict[str, Any]:
        """:meth:`load`, with an OSError retried after each of ``read_retry_s``; then
        UnreadableCheckpoint. FileNotFoundError and CorruptCheckpoint are raised at once."""
        path = self.directory / entry.name
        return self._retrying(path, lambda: self.load(entry))

    def _retrying(self, path: Path, read: Callable[[], T]) -> T:
        for wait in (*self.read_retry_s, None):
            try:
                return read()
            except FileNotFoundError:
                raise
            except OSError as error:
                if wait is None:
                    log.error(
                        "cannot read %s (%d tries): %s; failing rather than resuming from an "
                        "older checkpoint",
                        path,
                        len(self.read_retry_s) + 1,
                        error,
                    )
                    raise UnreadableCheckpoint(f"cannot read {path}: {error}") from error
                log.warning("reading %s failed (%s); trying again in %.1f s", path, error, wait)
                time.sleep(wait)
        raise AssertionError("unreachable")

    def latest(self) -> tuple[Entry, dict[str, Any]] | None:
        """The newest checkpoint that loads, skipping corrupt and missing ones; None when there
        is none. Raises UnreadableCheckpoint when the newest cannot be read."""
        if not self.directory.is_dir():
            return None
        names = [p.name for p in self.directory.iterdir()]
        for entry in candidates(self.entries(), names):
            try:
                return entry, self.read(entry)
            except FileNotFoundError as error:
                log.warning("skipping checkpoint %s: missing (%s)", entry.name, error)
            except CorruptCheckpoint as error:
                log.warning("skipping checkpoint %s: corrupt (%s)", entry.name, error)
                self.corrupt[entry.name] = entry
        return None


def _digest(path: Path) -> tuple[int, str]:
    """Size and SHA-256 of a file, read a block at a time."""
    sha256, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            sha256.update(block)
            size += len(block)
    return size, sha256.hexdigest()


def load_for_inference(path: str | os.PathLike[str]) -> torch.nn.Module:
    """The trained model as a plain module on CPU in eval mode, ready for inference.

    `path` is a checkpoint folder (its newest complete checkpoint is used) or one
    checkpoint file. The model is rebuilt from the settings stored in the checkpoint;
    its weights carry no DDP `module.` prefix.
    """
    from ddp_api.trainer_config import TrainerConfig
    from ddp_trainer.data.workloads import build_model

    target = Path(path)
    if target.is_dir():
        found = CheckpointStore(target).latest()
        if found is None:
            raise FileNotFoundError(f"no complete checkpoint in {target}")
        state = found[1]
    else:
        state = CheckpointStore(target.parent).read(Entry(target.name, step_of(target.name) or 0))
    config = TrainerConfig.model_validate(state["config"])
    model = build_model(config)
    model.load_state_dict(state["model"])
    return model.eval()
