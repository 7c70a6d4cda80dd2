"""The base of the servers the dev cluster runs as child processes of this machine (Kueue, the
operator, Prometheus): one :class:`~ddp_devcluster.plane.Process` each, a log to show when it
fails, and a context manager that starts and stops it."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Self

from .plane import Process


def http_ok(url: str, timeout_s: float = 1.0) -> bool:
    """Whether a GET of ``url`` answers 200 (a health or readiness endpoint)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class ManagedProcess:
    """A server in a child process (``self.process``), its output in ``self.log``.

    A subclass says how to ``start`` it (launching it with :meth:`launch` and waiting with
    :meth:`wait_for`); ``stop``, ``tail`` and the context manager are shared."""

    name: str  # the process's name, in messages
    tail_lines: int = 40  # how much of the log a failure shows
    process: Process | None

    @property
    def log(self) -> Path:
        raise NotImplementedError

    def start(self, timeout_s: float = 60.0) -> Self:
        raise NotImplementedError

    def launch(self, argv: list[str], env: dict[str, str]) -> Process:
        """Starts ``argv`` with ``env`` as this server's process, its output appended to log."""
        self.process = Process(self.name, argv, self.log, env)
        self.process.start()
        return self.process

    def wait_for(
        self, ok: Callable[[], bool], what: str, timeout_s: float, poll_s: float = 0.2
    ) -> None:
        """Polls ``ok`` until it holds; raises with the log's tail if the process exits
        first (RuntimeError) or ``timeout_s`` passes (TimeoutError)."""
        deadline = time.monotonic() + timeout_s
        while not ok():
            if self.process is not None and not self.process.alive():
                raise RuntimeError(f"{self.name} exited while waiting for {what}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"timed out after {timeout_s}s waiting for {what}:\n{self.tail()}"
                )
            time.sleep(poll_s)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def tail(self, lines: int | None = None) -> str:
        """The last ``lines`` (default ``tail_lines``) lines of the log."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-(lines or self.tail_lines) :])

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
