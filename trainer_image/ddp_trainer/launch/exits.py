"""How a trainer worker ends: with its code, once its output is flushed, without waiting on
what libraries leave behind.

A Python process that returns from ``main`` still runs its ``atexit`` work and its objects'
destructors before it exits: ``concurrent.futures`` joins every executor's threads (torchft's
Manager keeps one), and each process group's communicator is torn down. On a GPU an NCCL
communicator's teardown can wait on peers: a PerStep survivor on an H100 trained its last
step and did not exit (docs/benchmarks.md, "CUDA paths on a GPU"). By then the trainer has
closed what it owns (the final checkpoint written, the process groups destroyed or aborted),
so nothing is left that those waits would save. Every worker of the bundled trainer ends here,
so all end the same way: the ones torchrun forks warm (:mod:`ddp_trainer.launch.warm`: the CPU
pods and the tests) and a fresh ``python -m ddp_trainer`` (where a GPU is visible, or warm
workers are off); so does the torchrun agent the node supervisor forks."""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn


def exit_code(exc: SystemExit) -> int:
    """The status a Python process exits with for ``exc``."""
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else 1


def leave(run: Callable[[], int]) -> NoReturn:
    """Runs ``run`` and exits with its code (a SystemExit's, or 1 with the traceback), as soon
    as standard output and error are flushed."""
    code = 1
    try:
        code = run()
    except SystemExit as exc:
        code = exit_code(exc)
    except BaseException:
        traceback.print_exc()
    finally:
        exit_now(code)


def exit_now(code: int) -> NoReturn:
    """Exits with ``code`` as soon as standard output and error are flushed, from any thread
    (a watch's thread that fails its worker, :mod:`ddp_trainer.start_watch`)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
