"""Process helpers shared by the dev cluster, the trainer tests and the benchmarks."""

from __future__ import annotations

import contextlib
import os
import signal
import socket

from ddp_trainer.launch.supervisor import descendants  # one walk of /proc, the shipped node's


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kill_tree(pid: int) -> None:
    """SIGKILL `pid` and all its descendants at once, like a node that dies.

    torchrun starts workers in sessions of their own, so a process group is not enough.
    """
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def freeze_tree(pid: int) -> None:
    """SIGSTOP `pid` and all its descendants, like a machine that vanishes without a word
    (power off, network partition): its sockets stay open and nothing answers on them.
    The process itself first, so that it never sees its children stop."""
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGSTOP)
