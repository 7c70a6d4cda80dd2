"""How the ranks of a completed run end together (``ddp_trainer.end_together``), over a real
TCPStore on loopback served by "rank 0" as torchrun's rank 0 serves it: rank 0 keeps its store
up until every other rank has read its end, and not long past a rank that never does."""

from __future__ import annotations

import threading
import time
from threading import Event

import pytest
from trainer_harness import free_port

from ddp_trainer.end_together import EndStore, end_together
from ddp_trainer.launch.store_probe import open_store

SILENT_S = 30.0  # rank 0's silence a waiting rank tolerates: never reached here


def _stores(n: int, run_id: str = "run") -> list[EndStore]:
    """Rank 0's store (a server, as rank 0's process hosts it) and n - 1 clients of it."""
    port = free_port()
    server = open_store("127.0.0.1", port, 5.0, serve=True)
    clients = [open_store("127.0.0.1", port, 5.0, serve=False) for _ in range(n - 1)]
    return [EndStore(s, run_id) for s in (server, *clients)]


def _wait_in_thread(store: EndStore, ended: dict[int, str], rank: int) -> threading.Thread:
    def run() -> None:
        ended[rank] = end_together(store, False, SILENT_S, Event(), others=0)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.timeout(60)
def test_rank_0_leaves_only_after_every_other_rank_read_its_end() -> None:
    rank0, *others = _stores(3)
    ended: dict[int, str] = {}
    threads = [_wait_in_thread(s, ended, r) for r, s in enumerate(others, start=1)]
    time.sleep(0.5)  # the others wait: no end key yet
    assert ended == {}

    assert end_together(rank0, True, SILENT_S, Event(), others=2, ack_wait_s=20) == "ended"
    # By the time rank 0 may leave (taking its store along), both others have read the end.
    assert rank0.acknowledged() == 2
    for thread in threads:
        thread.join(5)
    assert ended == {1: "ended", 2: "ended"}


@pytest.mark.timeout(60)
def test_a_rank_that_never_reads_the_end_holds_rank_0_for_the_bound_only() -> None:
    rank0, reader, _lost = _stores(3)
    ended: dict[int, str] = {}
    thread = _wait_in_thread(reader, ended, 1)
    began = time.monotonic()
    assert end_together(rank0, True, SILENT_S, Event(), others=2, ack_wait_s=1.5) == (
        "unacknowledged"
    )
    waited = time.monotonic() - began
    assert 1.5 <= waited < 10, waited
    thread.join(5)
    assert ended == {1: "ended"} and rank0.acknowledged() == 1


@pytest.mark.timeout(60)
def test_sigterm_ends_rank_0s_wait_for_the_others() -> None:
    rank0, _lost = _stores(2)
    stop = Event()
    threading.Timer(0.3, stop.set).start()
    began = time.monotonic()
    assert end_together(rank0, True, SILENT_S, stop, others=1, ack_wait_s=30) == "ended"
    assert time.monotonic() - began < 10


def test_a_run_alone_waits_for_nobody() -> None:
    (rank0,) = _stores(1)
    assert end_together(rank0, True, SILENT_S, Event(), others=0, ack_wait_s=30) == "ended"
    assert rank0.acknowledged() == 0


class _SilentStore(EndStore):
    """Rank 0's store where torchrun's agents host it on a machine that went silent: the end
    key is set, and a read then never returns."""

    def __init__(self, store: EndStore):
        super().__init__(store.store, "run")
        self.never = Event()

    def acknowledged(self) -> int:
        self.never.wait()
        return 0


@pytest.mark.timeout(60)
def test_a_store_that_stops_answering_holds_rank_0_for_the_bound_only() -> None:
    (rank0,) = _stores(1)
    silent = _SilentStore(rank0)
    began = time.monotonic()
    assert end_together(silent, True, SILENT_S, Event(), others=1, ack_wait_s=1.0) == (
        "unacknowledged"
    )
    assert time.monotonic() - began < 5
    silent.never.set()
