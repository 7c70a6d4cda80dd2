"""Warm workers: torchrun's agent forks each worker from itself, with torch and the trainer
imported already, instead of starting a fresh ``python -u -m ddp_trainer``.

A fresh worker spends seconds of CPU before its first step: importing torch (2.3-2.6 s on this
project's CPU machines), the trainer, ``torch._dynamo`` (the first optimizer imports it) and, in
PerStep mode, torchft. torchrun starts every worker of a node again at every restart (a peer
lost or added, a failed worker), so that cost is paid on every incident, by every worker, while
the job waits. The node supervisor (:mod:`ddp_trainer.launch.supervisor`) imports all of it
once (:func:`preload`) before it forks torchrun's agent, and the agent's worker starts become
``fork()`` (:func:`install`): the worker runs ``ddp_trainer``'s ``main`` in a child of the
agent, with the environment, arguments, session and output files torchrun gives a worker
process, and exits with its code.

Only where it is safe: no GPU device in the container (``/dev/nvidia<N>``), since a process
that has touched CUDA cannot be forked into one that uses it, and nothing here has been
measured on a GPU yet; ``DDPJOB_WARM_WORKERS=0`` turns it off, ``=1`` on. Any other program
torchrun runs (a user's script, a NUMA-bound command) starts as always.

``python -m ddp_trainer.launch.warm TORCHRUN-ARGS`` is torchrun with warm workers and nothing
else (no supervisor): the loopback tests start their nodes with it.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from typing import IO, Any, NoReturn

from ddp_trainer.launch.exits import leave

log = logging.getLogger("ddp_trainer.node")

ENV_WARM = "DDPJOB_WARM_WORKERS"
WORKER_MODULE = "ddp_trainer"
GPU_DEVICES = "/dev/nvidia[0-9]*"
# What torchrun's agent installs and a worker must not inherit (the trainer sets its own).
RESET_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                 signal.SIGUSR2)  # fmt: skip


def enabled(environ: Mapping[str, str], gpus: Sequence[str] | None = None) -> bool:
    """Whether this node's workers start warm: ``DDPJOB_WARM_WORKERS`` when set to 0/1 (or
    false/true), else only without a GPU device."""
    setting = environ.get(ENV_WARM, "").strip().lower()
    if setting in ("0", "false", "no"):
        return False
    if setting in ("1", "true", "yes"):
        return True
    if setting:
        log.warning("%s=%r is not 0 or 1: warm only without a GPU", ENV_WARM, setting)
    return not (glob.glob(GPU_DEVICES) if gpus is None else gpus)


def runs_trainer(torchrun_args: Sequence[str]) -> bool:
    """Whether torchrun's arguments start the bundled trainer (``-m``/``--module
    ddp_trainer``), whose import is worth doing ahead; another program starts as always."""
    args = list(torchrun_args)
    return any(
        a == WORKER_MODULE and i > 0 and args[i - 1] in ("-m", "--module")
        for i, a in enumerate(args)
    )


def worker_args(command: Sequence[str], executable: str) -> list[str] | None:
    """The trainer's own arguments when ``command`` is torchrun's start of the bundled trainer
    (``<python> [-u] -m ddp_trainer ARGS``), else None (started as always)."""
    if list(command[:1]) != [executable]:
        return None
    rest = list(command[1:])
    if rest[:1] == ["-u"]:
        rest = rest[1:]
    if rest[:2] != ["-m", WORKER_MODULE]:
        return None
    return [str(a) for a in rest[2:]]


def preload(per_step: bool) -> None:
    """Imports what every worker imports, once, in the process torchrun's agent is forked from
    (no tensor math: no thread pool exists to be forked)."""
    import torch._dynamo  # the first optimizer imports it: seconds
    import torch.distributed  # noqa: F401

    import ddp_trainer.__main__
    import ddp_trainer.data.workloads
    import ddp_trainer.trainer

    if per_step:
        import ddp_trainer.per_step.trainer  # noqa: F401  torchft


class ForkedWorker:
    """A worker forked from the agent, with what torchrun's agent uses of a ``Popen``."""

    def __init__(self, args: Sequence[str], pid: int) -> None:
        self.args = list(args)
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                done, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: gone, its status unknown
                self.returncode = 1
                return self.returncode
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def fork_worker(
    command: Sequence[str],
    argv: Sequence[str],
    env: Mapping[str, str],
    stdout: IO[Any] | None,
    stderr: IO[Any] | None,
) -> ForkedWorker:
    """Starts the trainer with ``argv`` in a forked child, as ``Popen(command, env=env,
    stdout=stdout, stderr=stderr, start_new_session=True)`` would start it fresh."""
    sys.stdout.flush()
    sys.stderr.flush()
    started_r, started_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(started_r)
        _run_worker(argv, env, stdout, stderr, started_w)
    os.close(started_w)
    # As Popen returns only once the child's session exists: torchrun signals the worker's
    # process group (os.killpg) as soon as it stops it.
    os.read(started_r, 1)
    os.close(started_r)
    return ForkedWorker(command, pid)


def _run_worker(
    argv: Sequence[str],
    env: Mapping[str, str],
    stdout: IO[Any] | None,
    stderr: IO[Any] | None,
    started: int,
) -> NoReturn:
    try:
        os.setsid()
        os.close(started)
        for target, f in ((1, stdout), (2, stderr)):
            if f is not None:
                os.dup2(f.fileno(), target)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    run_trainer(argv, env)


def run_trainer(argv: Sequence[str], env: Mapping[str, str]) -> NoReturn:
    """In a forked child whose session and fds 0-2 are set up: ``ddp_trainer``'s ``main`` with
    ``argv`` and ``env`` as a fresh ``python -m ddp_trainer`` would run, then exit with its code
    as that would (:func:`ddp_trainer.launch.exits.leave`)."""

    def run() -> int:
        # New stream objects on fds 1 and 2: the parent's may have been locked by one of its
        # threads at the fork (line-buffered: torchrun starts workers with -u).
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        for signum in RESET_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = ["-m", *argv]
        import torch

        # OpenMP read its thread count when torch was loaded, in the parent; a worker's
        # OMP_NUM_THREADS (torchrun sets 1 with several workers per node) is applied here.
        with contextlib.suppress(ValueError):
            threads = int(env.get("OMP_NUM_THREADS", ""))
            if threads > 0:
                torch.set_num_threads(threads)
        from ddp_trainer.__main__ import main

        return main(list(argv))

    leave(run)


def install() -> None:
    """Makes torchrun's agent (in this process: call it in the child the supervisor forks) start
    the bundled trainer's workers with :func:`fork_worker`."""
    from torch.distributed.elastic.multiprocessing import api
    from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler

    class WarmHandler(SubprocessHandler):
        def _popen(self, args: tuple[Any, ...], env: dict[str, str]) -> Any:
            argv = worker_args(args, sys.executable)
            if argv is None:
                return super()._popen(args, env)
            return fork_worker(args, argv, env, self._stdout, self._stderr)

    def handler(
        entrypoint: str,
        args: tuple[Any, ...],
        env: dict[str, str],
        stdout: str,
        stderr: str,
        local_rank_id: int,
        numa_options: Any = None,
    ) -> SubprocessHandler:
        return WarmHandler(entrypoint, args, env, stdout, stderr, local_rank_id, numa_options)

    setattr(api, "get_subprocess_handler", handler)  # noqa: B010  (mypy: a function)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ddp_trainer.launch.warm TORCHRUN-ARGS``: plain torchrun (no supervisor) whose
    agent forks the bundled trainer's workers warm, where :func:`enabled` allows it."""
    from ddp_trainer.per_step.replicas import per_step

    args = list(sys.argv[1:] if argv is None else argv)
    if enabled(os.environ) and runs_trainer(args):
        preload(per_step(os.environ))
        install()
    from torch.distributed.run import main as torchrun

    torchrun(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
