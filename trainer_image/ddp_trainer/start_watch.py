"""How a run's start notices a lost machine within ``stepTimeoutS`` instead of ``pgTimeoutS``.

While a run starts (joining the process group, the model's broadcast, a resume, the first step),
its collectives wait ``pgTimeoutS`` (30 minutes) for a silent peer: ranks load data, read
checkpoints and warm up at their own pace, and no shorter bound on that work holds for every
job. A lost machine sends nothing, so its peers waited all of it. Yet a peer's progress and
its life are two questions: from the moment a worker starts until every rank has finished its
first step (:meth:`StartWatch.close`), a daemon thread of each rank counts a key of its own up
in torchrun's store every :data:`BEAT_S`, whatever the main thread is doing. Rank 0 reads every
rank's key; a rank whose key has not moved for ``stepTimeoutS`` is gone (its machine lost,
or frozen), so rank 0 counts the run's failed key up and exits, and torchrun's agents
re-rendezvous without that node, as when a collective times out. Every other rank reads rank
0's key and the failed key: it exits when the failed key moves, when rank 0's key stands still
for ``stepTimeoutS``, or when the store fails (the agents host it on rank 0's node: a reset or
refused connection is that node's end).

A call to a store whose machine went silent never returns, so the thread that calls the store
only records what it saw, and another one (:class:`StartWatch`'s judge) decides from when each
key last moved: a blocked call is silence. A process whose main thread hangs keeps beating:
this watch is about machines, not progress (``stepTimeoutS`` and the operator's stall
detection see to that once the run steps). Keys count up, never reset, so what an earlier
round left in the store only shifts where they start: each counts from what the watch first
read. ``tests/trainer/test_trainer_start_loss.py`` (two torchrun nodes, one frozen while the run
starts) and ``tests/trainer/test_trainer_start_watch_unit.py`` (the decisions; the threads on a
real TCPStore)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ddp_api.trainer_config import TrainerConfig
from ddp_trainer.distributed import DistEnv
from ddp_trainer.launch.exits import exit_now
from ddp_trainer.launch.store_probe import bounded, open_store, worker_store_endpoint

if TYPE_CHECKING:
    from torch.distributed import TCPStore

log = logging.getLogger("ddp_trainer.trainer")  # the trainer's lines: people and tests grep them

KEY = "ddp_trainer/start"
BEAT_S = 1.0  # at most: a fifth of the bound (two reads may fall between the same two beats)
JUDGE_S = 0.2
FAIL_CALL_S = 2.0  # rank 0 telling the others before it exits: its store is local
EXIT_PEER_LOST = 1  # a worker failure, as the collective's timeout would have made it


@dataclass
class Silence:
    """When each watched rank's key last moved (pure: the caller says what it read, and when);
    also what the ranks waiting at the end know of rank 0 (:mod:`ddp_trainer.end_together`)."""

    started: float
    seen: dict[int, tuple[int, float]] = field(default_factory=dict)  # rank: (count, moved at)

    def observe(self, rank: int, count: int, now: float) -> None:
        """A read of ``rank``'s key; the first read of a key starts its clock."""
        if rank not in self.seen or self.seen[rank][0] != count:
            self.seen[rank] = (count, now)

    def quiet_s(self, rank: int, now: float) -> float:
        """How long ``rank``'s key has stood still (since the watch started, if never read)."""
        return now - self.seen.get(rank, (0, self.started))[1]

    def silent(self, ranks: range | list[int], now: float, bound_s: float) -> list[int]:
        """The ranks whose key stood still for more than ``bound_s``."""
        return [rank for rank in ranks if self.quiet_s(rank, now) > bound_s]


@dataclass(frozen=True)
class Verdict:
    """Why this rank fails its worker now (``reason``), or that it goes on (empty)."""

    reason: str = ""

    def __bool__(self) -> bool:
        return bool(self.reason)


def judge(
    rank: int,
    world_size: int,
    silence: Silence,
    failed_moved: bool,
    store_error: str,
    now: float,
    bound_s: float,
) -> Verdict:
    """What a rank decides from what its watch saw: rank 0 fails when some rank was silent
    for more than ``bound_s``; every other rank when rank 0 said so (``failed_moved``), when
    the store failed, or when rank 0 was silent."""
    if rank == 0:
        silent = silence.silent(range(1, world_size), now, bound_s)
        if silent:
            ranks = ", ".join(str(r) for r in silent)
            quiet = max(silence.quiet_s(r, now) for r in silent)
            return Verdict(f"rank {ranks} gave no sign of life for {quiet:.0f}s")
        return Verdict()
    if failed_moved:
        return Verdict("rank 0 found a rank gone")
    if store_error:
        return Verdict(f"torchrun's store on rank 0's node is gone ({store_error})")
    if silence.silent([0], now, bound_s):
        return Verdict(f"rank 0 gave no sign of life for {silence.quiet_s(0, now):.0f}s")
    return Verdict()


class StartWatch:
    """This rank's beats and its watch over the others' while the run starts: two daemon
    threads, from :meth:`start` to :meth:`close`. ``leave`` ends the process (tests pass their
    own)."""

    def __init__(
        self,
        env: DistEnv,
        endpoint: tuple[str, int],
        bound_s: float,
        leave: Callable[[int], None] = exit_now,
    ):
        self.rank, self.world_size, self.endpoint = env.rank, env.world_size, endpoint
        self.bound_s, self.leave = bound_s, leave
        self.beat_s = min(BEAT_S, bound_s / 5)
        self.prefix = f"{KEY}/{env.run_id}"
        self.failed_key = f"{self.prefix}/failed"
        self.stopped = threading.Event()
        self.lock = threading.Lock()  # the poller writes what it saw; the judge reads it
        self.silence = Silence(time.monotonic())
        self.failed_at: int | None = None  # the failed key when first read
        self.failed_moved = False
        self.store_error = ""
        self.store: TCPStore | None = None

    def beats_key(self, rank: int) -> str:
        return f"{self.prefix}/beats/{rank}"

    def start(self) -> StartWatch:
        for target, name in ((self._poll, "start-beats"), (self._judge, "start-watch")):
            threading.Thread(target=target, name=name, daemon=True).start()
        return self

    def close(self) -> None:
        """Every rank is past its start: collectives time out at ``stepTimeoutS`` now."""
        self.stopped.set()  # a call blocked on a silent store is left behind

    def _watched(self) -> list[int]:
        return list(range(1, self.world_size)) if self.rank == 0 else [0]

    def _poll(self) -> None:
        """Beats and reads until closed; records what it saw, decides nothing."""
        try:
            host, port = self.endpoint
            self.store = store = open_store(host, port, self.bound_s, serve=False)
            while not self.stopped.is_set():
                store.add(self.beats_key(self.rank), 1)
                counts = {rank: int(store.add(self.beats_key(rank), 0)) for rank in self._watched()}
                now = time.monotonic()
                with self.lock:  # never held across a store call: that one may never return
                    for rank, count in counts.items():
                        self.silence.observe(rank, count, now)
                if self.rank != 0:
                    failed = int(store.add(self.failed_key, 0))
                    if self.failed_at is None:
                        self.failed_at = failed
                    self.failed_moved = failed != self.failed_at
                self.stopped.wait(self.beat_s)
        except Exception as error:
            self.store_error = str(error) or type(error).__name__

    def _judge(self) -> None:
        while not self.stopped.wait(JUDGE_S):
            with self.lock:
                verdict = judge(
                    self.rank, self.world_size, self.silence, self.failed_moved,
                    self.store_error, time.monotonic(), self.bound_s,
                )  # fmt: skip
            if verdict and not self.stopped.is_set():
                self._fail(verdict)
                return

    def _fail(self, verdict: Verdict) -> None:
        """Tells the others (rank 0), says why, and ends this worker: torchrun restarts the
        workers and re-rendezvouses without the node that is gone."""
        if self.rank == 0 and self.store is not None:
            store, key = self.store, self.failed_key
            try:
                bounded(lambda: store.add(key, 1), FAIL_CALL_S)
            except Exception as error:  # the others see this rank's beats stop instead
                log.warning("could not tell the other ranks: %s", error)
        log.error(
            "%s while the run started (its machine lost?): failing this worker so that torchrun"
            " re-rendezvouses without it, instead of waiting pgTimeoutS in a collective",
            verdict.reason,
        )
        self.leave(EXIT_PEER_LOST)


def watch_start(env: DistEnv, config: TrainerConfig) -> StartWatch | None:
    """The watch over this run's start, started; None where there is nothing to watch (one
    process, no torchrun store) or no shorter bound than ``pgTimeoutS`` to keep."""
    endpoint = worker_store_endpoint(os.environ)
    bound_s = config.steady_timeout_s
    if not env.launched or env.world_size < 2 or endpoint is None:
        return None
    if bound_s >= config.pg_timeout_s:
        return None
    return StartWatch(env, endpoint, bound_s).start()
