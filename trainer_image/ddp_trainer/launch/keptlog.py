"""A node pod's log kept on the checkpoint volume, bounded and rotated, for when the pod is gone.

The node wrapper (:mod:`ddp_trainer.launch.supervisor`) relays torchrun's stdout and stderr to
its own, byte for byte (``kubectl logs`` shows what it showed before), and puts each line, after the
RFC 3339 time it was received (as ``pods/log?timestamps=true`` writes it), into
``<checkpoint folder>/logs/<pod>.log`` (``ddp_api.contract``: the names ``kubectl ddp logs``
reads back). Past ``DDPJOB_LOG_FILE_MIB`` MiB the file is rotated to ``<pod>.log.1`` and the
older ones move up, ``DDPJOB_LOG_FILES`` files in all (defaults 10 MiB and 5, the kubelet's own
``containerLogMaxSize`` and ``containerLogMaxFiles``); ``DDPJOB_LOG_FILES=0`` keeps none.

The volume never stops or slows training: lines wait in a bounded queue for a thread of their
own that writes them; while that thread is stuck (a slow or hung volume) the queue fills and
further lines are counted, not kept (a line in the file says how many); at the first write
error it logs one warning and keeps nothing more. Decisions are functions without I/O.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ddp_api.contract import ENV_LOG_FILE_MIB, ENV_LOG_FILES, LOGS_DIR, kept_log_name

log = logging.getLogger("ddp_trainer.node")

DEFAULT_FILES = 5
DEFAULT_FILE_MIB = 10.0
MAX_LINE_BYTES = 64 * 1024  # a longer line (or one never ended) is kept in pieces of this size
QUEUE_LINES = 10_000  # lines waiting for the writer before further ones are dropped
DRAIN_S = 2.0  # at exit: how long the writer may take for the lines still waiting


@dataclass(frozen=True)
class Settings:
    """How much of a pod's log is kept: ``files`` files of ``file_bytes`` each at most."""

    files: int = DEFAULT_FILES
    file_bytes: int = int(DEFAULT_FILE_MIB * 2**20)

    @property
    def keeps(self) -> bool:
        return self.files > 0

    def describe(self) -> str:
        return f"{self.files} files of {self.file_bytes / 2**20:g} MiB"


def settings_from(environ: Mapping[str, str]) -> tuple[Settings, list[str]]:
    """The settings of ``DDPJOB_LOG_FILES`` and ``DDPJOB_LOG_FILE_MIB``, and a warning for each
    value that is not one (its default is used)."""
    warnings = []
    files, mib = DEFAULT_FILES, DEFAULT_FILE_MIB
    text = environ.get(ENV_LOG_FILES, "").strip()
    if text:
        try:
            files = int(text)
            if files < 0:
                raise ValueError
        except ValueError:
            warnings.append(f"{ENV_LOG_FILES}={text!r} is not an integer >= 0; {DEFAULT_FILES}")
            files = DEFAULT_FILES
    text = environ.get(ENV_LOG_FILE_MIB, "").strip()
    if text:
        try:
            mib = float(text)
            if not 0 < mib < 2**20:
                raise ValueError
        except ValueError:
            warnings.append(
                f"{ENV_LOG_FILE_MIB}={text!r} is not a size in MiB > 0; {DEFAULT_FILE_MIB:g}"
            )
            mib = DEFAULT_FILE_MIB
    return Settings(files=files, file_bytes=max(1, int(mib * 2**20))), warnings


def stamp(ns: int) -> str:
    """``2025-01-02T03:04:05.123456789Z``: the RFC 3339 time (UTC, nanoseconds) of ``ns``
    nanoseconds since the epoch, as the kubelet writes a line's time."""
    seconds, nanos = divmod(ns, 1_000_000_000)
    whole = dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}.{nanos:09d}Z"


def kept_line(ns: int, text: bytes) -> bytes:
    """One line of the kept log: its time, a space, the line as the pod wrote it."""
    return stamp(ns).encode() + b" " + text + b"\n"


def split_lines(
    pending: bytes, chunk: bytes, max_line: int = MAX_LINE_BYTES
) -> tuple[list[bytes], bytes]:
    """The lines completed by ``chunk`` after ``pending`` (without their newline), and what
    is left of a line not ended yet. A line longer than ``max_line`` is cut into pieces."""
    *lines, rest = (pending + chunk).split(b"\n")
    out = []
    for line in lines:
        out += [line[i : i + max_line] for i in range(0, max(len(line), 1), max_line)]
    while len(rest) > max_line:
        out.append(rest[:max_line])
        rest = rest[max_line:]
    return out, rest


def must_rotate(size: int, incoming: int, settings: Settings) -> bool:
    """Whether the file of ``size`` bytes is rotated before ``incoming`` more are written (a
    file never holds less than one write, however large)."""
    return size > 0 and size + incoming > settings.file_bytes


def rotation(pod: str, settings: Settings) -> list[tuple[str, str]]:
    """The renames that rotate ``pod``'s kept log, in order: the oldest kept file is replaced
    by the one before it, ..., ``<pod>.log`` becomes ``<pod>.log.1``. None when one file is
    kept: it is started again."""
    return [
        (kept_log_name(pod, part - 1), kept_log_name(pod, part))
        for part in range(settings.files - 1, 0, -1)
    ]


def dropped_line(count: int) -> bytes:
    return (
        f"ddp_trainer.node: {count} lines of this pod's log were not kept here: the volume"
        " was slower than the log (kubectl logs has them while the pod exists)"
    ).encode()


class KeptLog:
    """Lines of one pod's log, written to its files on the volume by a thread of their own."""

    def __init__(self, folder: str | os.PathLike[str], pod: str, settings: Settings) -> None:
        self.folder = Path(folder) / LOGS_DIR
        self.pod = pod
        self.settings = settings
        self.dropped = 0
        self.failed = False
        self._lines: queue.Queue[tuple[int, bytes] | None] = queue.Queue(QUEUE_LINES)
        self._file: IO[bytes] | None = None
        self._size = 0
        self._writer = threading.Thread(target=self._write_all, name="kept-log", daemon=True)
        self._writer.start()

    @property
    def path(self) -> Path:
        return self.folder / kept_log_name(self.pod)

    def put(self, text: bytes) -> None:
        """Keeps one line (without its newline), timed now; never blocks."""
        if self.failed:
            return
        try:
            self._lines.put_nowait((time.time_ns(), text))
        except queue.Full:
            self.dropped += 1

    def close(self, timeout_s: float = DRAIN_S) -> None:
        """Writes what still waits (for at most ``timeout_s``) and closes the file."""
        if not self._writer.is_alive():  # it failed: nothing waits for it
            return
        with contextlib.suppress(queue.Full):
            self._lines.put(None, timeout=timeout_s)
        self._writer.join(timeout_s)

    def _write_all(self) -> None:
        try:
            while True:
                item = self._lines.get()
                batch = [item]
                while item is not None and len(batch) < 512:
                    try:
                        item = self._lines.get_nowait()
                    except queue.Empty:
                        break
                    batch.append(item)
                if self.dropped:
                    count, self.dropped = self.dropped, 0
                    self._write(kept_line(time.time_ns(), dropped_line(count)))
                for entry in batch:
                    if entry is not None:
                        self._write(kept_line(*entry))
                if self._file is not None:
                    self._file.flush()
                if batch[-1] is None:
                    break
        except OSError as error:  # full, gone, read-only: training goes on, the log is not kept
            self.failed = True
            log.warning("cannot keep this pod's log in %s (%s): no longer kept", self.path, error)
        finally:
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.close()

    def _write(self, line: bytes) -> None:
        if self._file is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "ab")  # noqa: SIM115 (open while the pod runs)
            self._size = self._file.tell()
        if must_rotate(self._size, len(line), self.settings):
            self._file.close()
            for old, new in rotation(self.pod, self.settings):
                with contextlib.suppress(FileNotFoundError):
                    os.replace(self.folder / old, self.folder / new)
            self._file = open(self.path, "wb")  # noqa: SIM115
            self._size = 0
        self._file.write(line)
        self._size += len(line)


class Relay:
    """Copies what a child writes to a pipe to this process's ``out`` descriptor as it comes,
    and each line of it to a :class:`KeptLog` (where one is kept) and to ``heard``."""

    def __init__(
        self,
        fd: int,
        out: int,
        kept: KeptLog | None,
        heard: Callable[[bytes], None] | None = None,
    ) -> None:
        self.fd, self.out, self.kept, self.heard = fd, out, kept, heard
        self._thread = threading.Thread(target=self._run, name=f"relay-{out}", daemon=True)
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def _run(self) -> None:
        pending = b""
        relaying = True
        try:
            while chunk := os.read(self.fd, 65536):
                view = memoryview(chunk)
                try:
                    while relaying and view:
                        view = view[os.write(self.out, view) :]
                except OSError:  # our own stdout is gone: the child must not block on its pipe
                    relaying = False
                lines, pending = split_lines(pending, chunk)
                for line in lines:
                    if self.kept is not None:
                        self.kept.put(line)
                    if self.heard is not None:
                        self.heard(line)
        except OSError:
            pass
        finally:
            if pending and self.kept is not None:
                self.kept.put(pending)
            with contextlib.suppress(OSError):
                os.close(self.fd)


class KeptLogHandler(logging.Handler):
    """The node wrapper's own log records, kept beside torchrun's lines (in this process only:
    a forked child's records reach the kept log through its relayed stderr)."""

    def __init__(self, kept: KeptLog, formatter: logging.Formatter | None) -> None:
        super().__init__()
        self.kept = kept
        self.pid = os.getpid()
        if formatter is not None:
            self.setFormatter(formatter)

    def emit(self, record: logging.LogRecord) -> None:
        if os.getpid() != self.pid:
            return
        try:
            for line in self.format(record).split("\n"):
                self.kept.put(line.encode(errors="replace"))
        except Exception:
            self.handleError(record)


def keep(folder: str | None, pod: str | None, environ: Mapping[str, Any]) -> KeptLog | None:
    """The kept log of this pod, or None where none is kept (no checkpoint folder, no pod name,
    ``DDPJOB_LOG_FILES=0``); the wrapper's own records go there too from now on."""
    settings, warnings = settings_from(environ)
    for warning in warnings:
        log.warning("%s", warning)
    if not folder or not pod or not settings.keeps:
        return None
    kept = KeptLog(folder, pod, settings)
    root = logging.getLogger()
    formatter = root.handlers[0].formatter if root.handlers else None
    root.addHandler(KeptLogHandler(kept, formatter))
    log.info("keeping this pod's log in %s (%s)", kept.path, settings.describe())
    return kept
