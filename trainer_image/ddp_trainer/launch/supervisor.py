"""What a node pod runs: torchrun, started again in the same pod when the rendezvous store it
joined is gone, so that losing the store pod fails no worker pod.

``python -m ddp_trainer.node ARGS...`` runs ``torchrun ARGS...`` (its flags from ``PET_*``).
torchrun's agent gives up as soon as its c10d store stops answering; the workers then stop
(rank 0 checkpoints on SIGTERM) and torchrun exits non-zero. That exit is this pod's failure
only if the store is still the one torchrun joined: every store publishes a random id when it
starts (:mod:`ddp_trainer.launch.store_probe`). A different id, or no store at all, means the
store pod was replaced: wait until the new one answers and start torchrun again; the workers
re-rendezvous and resume from the newest checkpoint. At most
``PET_MAX_RESTARTS`` such restarts per pod; any other exit is passed on as it is.

The end of a run: a node that starts after training of its run completed (the completion
record that rank 0 writes in the checkpoint folder names its ``--rdzv-id``) exits 0 without
starting torchrun: its peers closed the rendezvous, so torchrun could only fail. And torchrun's
agent, once its workers finished, waits for the other agents at an exit barrier, for 300 s by
default, which a peer lost at the last step never reaches; here it waits at most
``DDPJOB_EXIT_BARRIER_S`` (default
:data:`~ddp_trainer.launch.settings.DEFAULT_EXIT_BARRIER_S`), then exits 0 all the same.

Its log is kept: torchrun's stdout and stderr pass through this process, unchanged, and each
line is also kept, timed, in the checkpoint folder's ``logs/<pod>.log``, bounded and rotated
(:mod:`ddp_trainer.launch.keptlog`), for ``kubectl ddp logs`` once the pod is gone.

PerStep mode (``DDPJOB_FAULT_TOLERANCE=PerStep``, :mod:`ddp_trainer.per_step`): the operator runs
torchrun standalone (``PET_STANDALONE=1``, ``PET_NNODES=1``): each pod is a replica group
with a rendezvous of its own, and there is no job-wide store to wait for, watch or outlive, so
none of that runs; torchrun's exit is passed on as it is. The completion record then names
:func:`ddp_trainer.per_step.replicas.run_id` (standalone torchrun's own run id is random per
start), and a pod that starts after training completed still exits 0 at once. The kept log and the
bounded exit barrier (which has only this pod's agent to wait for) are as in Restart mode.

torchrun runs in a child forked from this process, which has imported torch already (the
store probe needs it): starting it costs no second torch import (2-3 s on two cores), on
every start and in every store-loss recovery. Forking with torch imported is what
DataLoader workers do. The workers torchrun starts are forked from its agent in turn, with the
trainer imported once per pod (:mod:`ddp_trainer.launch.warm`; not where a GPU is visible):
fresh interpreters only for other programs, or with ``DDPJOB_WARM_WORKERS=0``.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from ddp_api.contract import ENV_POD_NAME
from ddp_trainer.launch import warm
from ddp_trainer.launch.exits import clear_why, leave, say_why
from ddp_trainer.launch.keptlog import KeptLog, Relay, keep
from ddp_trainer.launch.last_words import LastWords
from ddp_trainer.launch.settings import (
    DEFAULT_EXIT_BARRIER_S,
    checkpoint_folder,
    completed,
    exit_barrier_s,
    restarts_allowed,
    torchrun_setting,
)
from ddp_trainer.launch.store_probe import probe_store_id, store_replaced, wait_for_store
from ddp_trainer.per_step.replicas import per_step, run_id

if TYPE_CHECKING:
    pass

log = logging.getLogger("ddp_trainer.node")

STORE_WAIT_S = 900.0  # as long as torchrun's join_timeout: pods start minutes apart
LOST_CHECK_S = 5.0  # after torchrun failed: how long to look for the store it joined
STORE_WATCH_S = 5.0  # while torchrun runs: how often to look whether its store was replaced
# torchrun stopped for a replaced store: SIGTERM, then SIGKILL of it and its workers after this:
# the 30 s torchrun's own wait gives its workers. A node pod's torchrun waits longer for them
# (PET_SHUTDOWN_TIMEOUT, the pod's grace period: for the pod's own SIGTERM); a worker blocked in
# a collective with a peer the store's machine took along cannot act on SIGTERM, and would hold
# the restart that long.
STOP_GRACE_S = 30.0
WORKER_STOP_S = 10.0  # how long workers stopped for a restart get before SIGKILL (torchrun: 30)
RELAY_DRAIN_S = 2.0  # once torchrun exited: how long its last lines may take to pass through
REAP_POLL_S = 0.05  # while torchrun runs: how often to look whether it exited (and at signals)


@dataclass(frozen=True)
class Outcome:
    """What to do after torchrun exited: start it again, or exit with ``code``."""

    restart: bool
    code: int
    reason: str


def after_exit(
    code: int, joined: str | None, now: str | None, restarts_left: int, stopping: bool
) -> Outcome:
    """Decides from torchrun's exit code and the store's id when it started (``joined``) and
    now (``now``; None when no store answers)."""
    if stopping:
        return Outcome(False, code, "the pod is stopping")
    if code == 0:
        return Outcome(False, 0, "torchrun finished")
    if joined is None or now == joined:
        return Outcome(False, code, f"torchrun failed with exit code {code}")
    lost = "no longer answers" if now is None else "was replaced"
    if restarts_left <= 0:
        return Outcome(
            False, code, f"the rendezvous store {lost}, and no store-loss restarts are left"
        )
    return Outcome(True, code, f"the rendezvous store {lost}")


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torchrun's workers run in sessions of their own, so its
    process group does not hold them)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry}/stat").read()  # noqa: SIM115 (one read)
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


AGENT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)  # torchrun's


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """A death signal that comes while torchrun's agent stops its workers for a restart is
    held until they are stopped, then raised as torchrun's own ``SignalException`` (in the main
    thread only; elsewhere nothing changes). torchrun's handler raises that exception wherever
    the main thread is, and when that is the wait for its log tailers (``TailLog.stop``, which
    catches every Exception and logs "error in log tailer"), the signal is lost: the agent
    goes on to restart its workers, joins the next rendezvous round and trains on in a pod that
    is being deleted. Seen on kind: a pod removed by ``kubectl scale`` down trained the last 9
    steps as rank 0 of a world of 3, not 2. Deferred, the signal ends the agent as at any other
    moment: it stops (its workers are stopped already) and exits."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    from torch.distributed.elastic.multiprocessing.api import SignalException

    came: list[int] = []
    before = {sig: signal.getsignal(sig) for sig in AGENT_SIGNALS}
    for sig in AGENT_SIGNALS:
        signal.signal(sig, lambda signum, frame: came.append(signum))
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    if came:
        sigval = signal.Signals(came[0])
        log.info("%s came while the workers stopped for a restart: stopping", sigval.name)
        raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)


def bound_agent_waits(barrier_s: float, stop_s: float = WORKER_STOP_S) -> None:
    """Bounds two waits of torchrun's agent (in the forked child only), for which torchrun has
    no flag: the exit barrier (``exit_barrier_timeout``, which
    ``torch.distributed.launcher.api.launch_agent`` leaves at 300 s) becomes ``barrier_s``, and
    stopping its workers for a restart (a peer lost or added: SIGTERM, then SIGKILL after 30 s)
    gives them ``stop_s``. A worker blocked in a collective with a lost peer cannot act on
    SIGTERM, so those 30 s were spent in full at every lost machine; rank 0 of a worker that
    can act saves its step within ``stop_s`` (or training resumes from the checkpoint before).
    The launcher is given a subclass of ``LocalElasticAgent`` with these waits."""
    from torch.distributed.elastic.agent.server.api import WorkerGroup
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.launcher import api

    bounded = "timeout" in inspect.signature(LocalElasticAgent._shutdown).parameters

    class BoundedWaitsAgent(LocalElasticAgent):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("exit_barrier_timeout", barrier_s)
            super().__init__(*args, **kwargs)

        def _stop_workers(self, worker_group: WorkerGroup) -> None:
            with signals_deferred():
                if bounded:
                    self._shutdown(timeout=int(stop_s))
                else:  # an older torch (2.11's agent has no timeout): its own 30 s
                    self._shutdown()

    setattr(api, "LocalElasticAgent", BoundedWaitsAgent)  # noqa: B010  (mypy: a type)


def keep_rendezvous_open() -> None:
    """Makes torchrun leave the job's c10d rendezvous open when it exits (in the forked child
    only). torchrun's launcher shuts the rendezvous down whenever its agent ends other than by a
    signal: a node whose workers failed, or that waited in vain for a silent peer, closes it for
    good, and every node that joins afterwards (the operator's replacement pods, this pod's own
    restart) fails at once with RendezvousClosedError: a crash loop that spends the job's
    ``backoffLimit`` until the job fails, for want of one open flag in the store. A node that
    starts after training completed needs no closed rendezvous to stop: it exits 0 on the
    completion record (module docstring)."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    def shutdown(self: dr.DynamicRendezvousHandler) -> bool:
        """What torchrun's own does but the closing: stop the heartbeats and leave."""
        log.info("leaving the rendezvous, open for the nodes that join after this one")
        self._stop_heartbeats()
        try:
            deadline = self._get_deadline(self._settings.timeout.close)
            self._op_executor.run(dr._RendezvousExitOp(), deadline)
        except Exception as e:  # its peers drop it after their keep-alive timeout anyway
            log.warning("could not leave the rendezvous (%r); the others will time it out", e)
        return True

    setattr(dr.DynamicRendezvousHandler, "shutdown", shutdown)  # noqa: B010


def run_torchrun(
    args: Sequence[str], barrier_s: float = DEFAULT_EXIT_BARRIER_S, warm_workers: bool = False
) -> NoReturn:
    """In the forked child: torchrun's main, exiting as ``python -m torch.distributed.run``
    would (0, its SystemExit's code, or 1 with the traceback); ``warm_workers``: the agent
    forks the bundled trainer's workers (:mod:`ddp_trainer.launch.warm`)."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_DFL)  # torchrun installs its own while it runs

    def run() -> int:
        bound_agent_waits(barrier_s)
        keep_rendezvous_open()
        if warm_workers:
            warm.install()
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import main as torchrun

        try:
            torchrun(list(args))
        except ChildFailedError:  # a worker failed: its words are its own, not this summary
            traceback.print_exc()
            return 1
        return 0

    leave(run)


class Torchrun:
    """torchrun in a forked child of this (torch-importing) process. Its stderr is a pipe that
    this process relays to its own, and :attr:`last_words` reads for the first worker's
    exception; with a kept log its stdout is relayed too, and both are kept."""

    def __init__(
        self,
        args: Sequence[str],
        barrier_s: float = DEFAULT_EXIT_BARRIER_S,
        kept: KeptLog | None = None,
        warm_workers: bool = False,
    ) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        pipes = {target: os.pipe() for target in ((1, 2) if kept is not None else (2,))}
        pid = os.fork()
        if pid == 0:
            for target, (read, write) in pipes.items():
                os.dup2(write, target)
                os.close(read)
                os.close(write)
            run_torchrun(args, barrier_s, warm_workers)
        self.pid = pid
        self.code: int | None = None
        self.relays: list[Relay] = []
        self.last_words = LastWords()
        for target, (read, write) in pipes.items():
            os.close(write)
            heard = self.last_words.feed if target == 2 else None
            self.relays.append(Relay(read, target, kept, heard))

    def wait(self) -> int:
        """torchrun's exit code, once it exited. Looked for between short sleeps, not in one
        blocking ``waitpid``: a SIGTERM that the kernel hands to one of this process's other
        threads (its relays, the kept log's writer, the store watch) trips Python's flag but
        does not wake a main thread blocked in a system call, so the handler that passes it on
        to torchrun would wait for torchrun to end by itself, and the pod's grace period would
        run out with no worker told to checkpoint. Between sleeps the handler runs."""
        while self.code is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.code = os.waitstatus_to_exitcode(status)
            else:
                time.sleep(REAP_POLL_S)
        # Its last lines; not longer: a worker left behind may hold the pipe open.
        deadline = time.monotonic() + RELAY_DRAIN_S
        for relay in self.relays:
            relay.join(max(0.0, deadline - time.monotonic()))
        return self.code

    def send_signal(self, signum: int) -> None:
        if self.code is None:
            with contextlib.suppress(ProcessLookupError):  # reaped already
                os.kill(self.pid, signum)


def watch_store(child: Torchrun, endpoint: str, joined: str | None, stopping: Any) -> None:
    """While torchrun runs, looks every STORE_WATCH_S whether another store answers at the
    endpoint. When the store's machine is lost without a word (no TCP reset), torchrun's agent
    can hang on the old store's connection; a new store (the operator replaced the lost pod)
    means the old one is gone for sure: torchrun is stopped (SIGTERM, then SIGKILL of it and
    its workers after STOP_GRACE_S), and started again by ``main`` as after any store loss."""

    def watch() -> None:
        while child.code is None and not stopping():
            time.sleep(STORE_WATCH_S)
            now = probe_store_id(endpoint)
            if child.code is None and store_replaced(joined, now):
                log.warning(
                    "the rendezvous store torchrun joined (%s) was replaced (%s answers at %s):"
                    " stopping torchrun",
                    joined,
                    now,
                    endpoint,
                )
                child.send_signal(signal.SIGTERM)
                deadline = time.monotonic() + STOP_GRACE_S
                while child.code is None and time.monotonic() < deadline:
                    time.sleep(0.5)
                if child.code is None:
                    log.warning("torchrun did not stop in %.0fs: SIGKILL", STOP_GRACE_S)
                    for pid in [child.pid, *descendants(child.pid)]:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                return

    threading.Thread(target=watch, name="store-watch", daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    kept = keep(checkpoint_folder(args, os.environ), os.environ.get(ENV_POD_NAME), os.environ)
    try:
        return supervise(args, kept)
    finally:
        if kept is not None:
            kept.close()


def supervise(args: list[str], kept: KeptLog | None) -> int:
    """Runs torchrun, and again after losing the store, until an exit ends the pod."""
    alone = per_step(os.environ)  # a replica group: no job-wide store
    endpoint = "" if alone else torchrun_setting(args, os.environ, "rdzv-endpoint") or ""
    left = restarts_allowed(args, os.environ)
    child: Torchrun | None = None
    stopping = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True
        if child is not None:
            child.send_signal(signum)  # torchrun passes it on to its workers

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    import torch.distributed.run  # noqa: F401  imported once, here: each start forks warm

    from ddp_trainer.state.store import read_completion

    folder = checkpoint_folder(args, os.environ)
    done = read_completion(folder) if folder else None
    run = run_id(os.environ) if alone else torchrun_setting(args, os.environ, "rdzv-id")
    if done is not None and completed(done, run):
        log.info(
            "training of this job completed at step %d (%s in %s): exiting 0 without starting"
            " torchrun",
            done.step,
            done.checkpoint,
            folder,
        )
        return 0
    barrier_s = exit_barrier_s(os.environ)
    warm_workers = warm.enabled(os.environ) and warm.runs_trainer(args)
    if warm_workers:  # once per pod, not at each worker (re)start
        began = time.monotonic()
        warm.preload(alone)
        log.info("imported the trainer for warm worker starts in %.1fs", time.monotonic() - began)

    while True:
        joined = wait_for_store(endpoint, STORE_WAIT_S, lambda: stopping) if endpoint else None
        if stopping:
            return 128 + signal.SIGTERM
        if endpoint and joined is None:
            log.error("no rendezvous store answered at %s in %.0fs", endpoint, STORE_WAIT_S)
            clear_why()  # the cause now, not an earlier start's
            say_why(
                f"RendezvousStoreUnreachable: no rendezvous store answered at {endpoint} in"
                f" {STORE_WAIT_S:.0f}s"
            )
            return 1
        clear_why()  # what an earlier start's workers said is not this start's
        child = Torchrun(args, barrier_s, kept, warm_workers)
        if stopping:  # a signal between the fork and the line above found no child to pass on to
            child.send_signal(signal.SIGTERM)
        if endpoint:
            watch_store(child, endpoint, joined, lambda: stopping)
        code = child.wait()
        now = (
            wait_for_store(endpoint, LOST_CHECK_S, lambda: stopping)
            if endpoint and code != 0 and not stopping
            else joined
        )
        outcome = after_exit(code, joined, now, left, stopping)
        if not outcome.restart:
            if code != 0:
                log.info("exiting with torchrun's code %d: %s", code, outcome.reason)
            if outcome.code != 0 and not stopping and child.last_words.said:
                say_why(child.last_words.said)  # a worker's own message, written first, stays
            return outcome.code
        left -= 1
        log.warning(
            "%s (torchrun exited %d): starting torchrun again once it answers; "
            "the workers resume from the newest checkpoint (%d store-loss restarts left)",
            outcome.reason,
            code,
            left,
        )


if __name__ == "__main__":
    leave(main)  # as ddp_trainer.node does (see there)
