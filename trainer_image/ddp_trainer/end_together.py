"""How the ranks of a completed run end together without a collective, which a peer lost at
the end would hold for pgTimeoutS (30 minutes; the barrier after rank 0's evaluation did).

Rank 0 counts a key up in torchrun's store while it finishes (its final checkpoint, its
evaluation: :class:`Beats`), then sets the end key. Every other rank waits for the end key
(:func:`end_together`) and counts an acknowledgement up once it has read it, but waits not past a
failed store call (the store is rank 0's: a reset connection is its end), a rank 0 that gave no
sign of life for stepTimeoutS, or SIGTERM: training is complete and checkpointed by then, so only
rank 0's evaluation results would be missing.

Rank 0's process hosts that store (the operator sets ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE``), so
the store ends with it: rank 0 waits until every other rank acknowledged the end, at most
:data:`ACK_WAIT_S`, and a peer lost while it evaluated holds it no longer than that. Before it
waited, the others' next read (every :data:`POLL_S`) often found the store gone: a C++ stack
trace and a "store is gone" warning at the end of a run that went well.

Every call on the store is bounded (:func:`ddp_trainer.launch.store_probe.bounded`) or runs in a
daemon thread of its own: where torchrun's agents host the store instead (its default, without
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE``) it may be on another machine, and a call to a store whose
machine went silent never returns. ``tests/trainer/test_trainer_end.py``."""

from __future__ import annotations

import logging
import os
import threading
import time
from threading import Event

import torch.distributed as dist

from ddp_trainer.launch.store_probe import bounded, open_store, worker_store_endpoint
from ddp_trainer.start_watch import Silence

log = logging.getLogger("ddp_trainer.trainer")  # the trainer's lines: people and tests grep them

END_KEY = "ddp_trainer/end"
BEATS_KEY = "ddp_trainer/end-beats"
ACKS_KEY = "ddp_trainer/end-acks"
BEAT_S = 1.0
POLL_S = 0.2
STORE_TIMEOUT_S = 5.0
ACK_WAIT_S = 5.0  # how long rank 0 keeps its store up for the others to read its end


class EndStore:
    """This run's two keys in torchrun's store (``MASTER_ADDR:MASTER_PORT``, the store of the
    process group), through a client of its own."""

    def __init__(self, store: dist.Store, run_id: str):
        self.store, self.end, self.beats = store, f"{END_KEY}/{run_id}", f"{BEATS_KEY}/{run_id}"
        self.acks = f"{ACKS_KEY}/{run_id}"

    def beat(self) -> None:
        self.store.add(self.beats, 1)

    def set_end(self) -> None:
        self.store.set(self.end, "1")

    def ended(self) -> bool:
        return bool(self.store.check([self.end]))

    def beats_seen(self) -> int:
        return int(self.store.add(self.beats, 0))

    def acknowledge(self) -> None:
        self.store.add(self.acks, 1)

    def acknowledged(self) -> int:
        return int(self.store.add(self.acks, 0))


def end_store(run_id: str) -> EndStore | None:
    """A client of torchrun's store for :func:`end_together`; None (with a warning) when there
    is none to reach."""
    endpoint = worker_store_endpoint(os.environ)
    if endpoint is None:
        return None
    host, port = endpoint
    try:
        store = bounded(
            lambda: open_store(host, port, STORE_TIMEOUT_S, serve=False), STORE_TIMEOUT_S
        )
    except Exception as error:
        log.warning("torchrun's store is unreachable at the end (%s): ending alone", error)
        return None
    return EndStore(store, run_id)


class Beats:
    """Rank 0's sign of life while it finishes: a daemon thread counts the beats up every
    :data:`BEAT_S` (nothing when ``store`` is None). A failed call ends the beats: the others
    then stop waiting after their silence bound, as for a lost rank 0."""

    def __init__(self, store: EndStore | None):
        self.store, self.stopped = store, Event()
        self.thread = threading.Thread(target=self._beat, name="end-beats", daemon=True)

    def _beat(self) -> None:
        assert self.store is not None
        try:
            while True:
                self.store.beat()
                if self.stopped.wait(BEAT_S):
                    return
        except Exception as error:
            log.warning("could not signal the other ranks while finishing: %s", error)

    def __enter__(self) -> Beats:
        if self.store is not None:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()  # a beat blocked on a silent store is left behind


class RankZeroWatch:
    """What a rank that waits for rank 0 has seen: whether it ended, whether the store failed
    (``lost``: it is gone, a refused or reset connection), and when rank 0's beats last moved
    (a daemon thread polls the store every :data:`POLL_S`; a call that never returns, as to a
    machine gone silent, stops the news, which is what silence is)."""

    def __init__(self, store: EndStore):
        self.store, self.ended, self.lost = store, False, ""
        self.silence = Silence(time.monotonic())  # of rank 0's beats
        threading.Thread(target=self._poll, name="rank0-watch", daemon=True).start()

    def _poll(self) -> None:
        try:
            while not self.store.ended():
                self.silence.observe(0, self.store.beats_seen(), time.monotonic())
                time.sleep(POLL_S)
        except Exception as error:
            self.lost = str(error) or type(error).__name__
            return
        try:
            self.store.acknowledge()  # rank 0 may leave (and its store with it)
        except Exception as error:  # it has left already: nothing more to tell it
            log.debug("could not acknowledge rank 0's end: %s", error)
        self.ended = True


def _acknowledged(store: EndStore, others: int, wait_s: float, stop: Event) -> str:
    """Rank 0, after setting the end key: waits until ``others`` ranks acknowledged it, at
    most ``wait_s`` (a store call that hangs included: the reads run in one bounded thread) or
    until SIGTERM."""
    deadline = time.monotonic() + wait_s
    seen = [0]

    def poll() -> None:
        while time.monotonic() < deadline and not stop.is_set():
            seen[0] = store.acknowledged()
            if seen[0] >= others:
                return
            time.sleep(POLL_S / 4)

    try:
        bounded(poll, wait_s + POLL_S)
    except Exception as error:
        log.warning("could not read the other ranks' acknowledgements of the end: %s", error)
        return "unacknowledged"
    if seen[0] >= others or stop.is_set():
        return "ended"
    log.warning(
        "%d of the %d other ranks acknowledged the end within %.0fs (lost while this one"
        " finished?): ending without them",
        seen[0],
        others,
        wait_s,
    )
    return "unacknowledged"


def end_together(
    store: EndStore,
    evaluates: bool,
    silent_s: float,
    stop: Event,
    others: int,
    ack_wait_s: float = ACK_WAIT_S,
) -> str:
    """Rank 0 (``evaluates``) sets the end key and waits for the ``others`` ranks to
    acknowledge it (at most ``ack_wait_s``); every other rank waits for it, at most until the
    store fails, rank 0 gave no sign of life (a store that does not answer is none either) for
    ``silent_s``, or SIGTERM came. Returns what ended the wait."""
    if evaluates:
        try:
            bounded(store.set_end, STORE_TIMEOUT_S)
        except Exception as error:  # the others stop waiting after silent_s
            log.warning("could not tell the other ranks that this one ended: %s", error)
            return "ended"
        return _acknowledged(store, others, ack_wait_s, stop) if others > 0 else "ended"
    watch = RankZeroWatch(store)
    while not watch.ended:
        if watch.lost:  # rank 0 hosts the store: its end or its loss
            log.warning(
                "training is complete and checkpointed; torchrun's store is gone (%s): ending"
                " without waiting for rank 0",
                watch.lost,
            )
            return "store lost"
        quiet_s = watch.silence.quiet_s(0, time.monotonic())
        if quiet_s > silent_s:
            log.warning(
                "training is complete and checkpointed; rank 0 gave no sign of life for %.0fs"
                " while finishing (its machine lost?): ending without its evaluation",
                quiet_s,
            )
            return "silent"
        if stop.is_set():
            log.info("SIGTERM while rank 0 finishes: training is complete, ending")
            return "SIGTERM"
        time.sleep(POLL_S)
    return "ended"
