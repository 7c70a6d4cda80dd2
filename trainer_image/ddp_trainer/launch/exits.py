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
workers are off); so does the torchrun agent the node supervisor forks.

A worker that fails on an exception says why in its pod's termination message
(:data:`ddp_api.contract.TERMINATION_LOG`): ``<Kind>: <message>``, which the kubelet copies into
the pod's status and the operator into the job's (an ``IncompatibleResume`` fails the job at
once). The first failure of a torchrun start is kept: the failures it causes in the pod's other
workers (a peer's collective that breaks) would only hide it. The node supervisor clears the
message before each torchrun start (:func:`clear_why`), so an earlier start's is never read as
a later one's."""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NoReturn

from ddp_api.contract import (
    ENV_TERMINATION_LOG,
    TERMINATION_LOG,
    TERMINATION_MAX_CHARS,
    one_line,
)

# What a signal raises (torchrun's agent: torch's SignalException on SIGTERM): the pod was told
# to stop, which is no failure of its own to tell.
SIGNALLED = frozenset({"SignalException", "KeyboardInterrupt"})


def exit_code(exc: SystemExit) -> int:
    """The status a Python process exits with for ``exc``."""
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else 1


def leave(run: Callable[[], int]) -> NoReturn:
    """Runs ``run`` and exits with its code (a SystemExit's, or 1 with the traceback; what a
    signal raises prints one line), as soon as standard output and error are flushed."""
    code = 1
    try:
        code = run()
    except SystemExit as exc:
        code = exit_code(exc)
    except BaseException as exc:
        if type(exc).__name__ in SIGNALLED:  # told to stop: one line, not a failure's traceback
            print(f"stopping: {termination_text(exc)}", file=sys.stderr)
        else:
            traceback.print_exc()
            say_why(termination_text(exc))
    finally:
        exit_now(code)


def exit_now(code: int) -> NoReturn:
    """Exits with ``code`` as soon as standard output and error are flushed, from any thread
    (a watch's thread that fails its worker, :mod:`ddp_trainer.start_watch`)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def termination_text(exc: BaseException) -> str:
    """The line a failed worker leaves as its termination message: ``<Kind>: <message>``, its
    whitespace folded, at most TERMINATION_MAX_CHARS long."""
    words = str(exc).strip()
    return one_line(
        f"{type(exc).__name__}: {words}" if words else type(exc).__name__, TERMINATION_MAX_CHARS
    )


def termination_log(env: Mapping[str, str]) -> Path | None:
    """Where this pod's termination message goes: ``DDPJOB_TERMINATION_LOG``, else the file the
    kubelet mounted at Kubernetes' default path; None outside a pod (nothing is created in
    /dev)."""
    if env.get(ENV_TERMINATION_LOG):
        return Path(env[ENV_TERMINATION_LOG])
    path = Path(TERMINATION_LOG)
    return path if path.is_file() else None


def say_why(text: str, env: Mapping[str, str] = os.environ) -> None:
    """Writes ``text`` as the termination message, unless one was written since the last
    :func:`clear_why`: the first failure is the cause, and later ones in the same pod are most
    often what it caused. Never raises: a worker that fails goes on to exit with its code."""
    path = termination_log(env)
    if path is None:
        return
    with contextlib.suppress(OSError), path.open("a", encoding="utf-8") as out:
        if out.tell() == 0:
            out.write(text)


def clear_why(env: Mapping[str, str] = os.environ) -> None:
    """Empties the termination message (before a torchrun start)."""
    path = termination_log(env)
    if path is not None:
        with contextlib.suppress(OSError):
            path.write_text("", encoding="utf-8")
