"""``ddp_trainer.start_watch``: its decisions (pure), and its threads on a real TCPStore, with a
``leave`` that records the exit instead of ending the test's process. The whole of it, two
torchrun nodes and a machine frozen while the run starts, is ``test_trainer_start_loss.py``."""

from __future__ import annotations

import threading

import pytest
from torch.distributed import TCPStore
from trainer_harness import Launcher, wait_until

from ddp_api.trainer_config import TrainerConfig
from ddp_devcluster.procs import free_port
from ddp_trainer.distributed import DistEnv
from ddp_trainer.launch.store_probe import open_store, split_endpoint
from ddp_trainer.start_watch import EXIT_PEER_LOST, Silence, StartWatch, judge, watch_start

BOUND_S = 10.0


def test_a_key_counts_from_its_first_read_and_a_key_never_read_from_the_start() -> None:
    silence = Silence(started=100.0)
    silence.observe(1, 57, now=101.0)  # what an earlier round left: not a move, a start
    silence.observe(1, 57, now=105.0)
    assert silence.quiet_s(1, now=106.0) == 5.0
    silence.observe(1, 58, now=107.0)
    assert silence.quiet_s(1, now=108.0) == 1.0
    assert silence.quiet_s(2, now=108.0) == 8.0  # never read: since the watch started
    assert silence.silent(range(1, 3), now=111.5, bound_s=5.0) == [2]


def test_rank_0_fails_on_any_silent_rank_and_names_it() -> None:
    silence = Silence(started=0.0)
    for rank in (1, 2, 3):
        silence.observe(rank, 1, now=0.0)
    silence.observe(1, 2, now=9.0)
    silence.observe(3, 2, now=9.0)
    assert not judge(0, 4, silence, False, "", now=BOUND_S, bound_s=BOUND_S)
    verdict = judge(0, 4, silence, False, "", now=10.5, bound_s=BOUND_S)
    assert verdict.reason == "rank 2 gave no sign of life for 10s"
    # rank 0 reads no failed key and its own store does not fail it: only silence does
    assert not judge(0, 4, Silence(started=0.0), True, "reset", now=1.0, bound_s=BOUND_S)


def test_another_rank_fails_on_rank_0s_word_its_store_or_its_silence() -> None:
    heard = Silence(started=0.0)
    heard.observe(0, 5, now=9.0)
    assert not judge(2, 4, heard, False, "", now=12.0, bound_s=BOUND_S)
    assert judge(2, 4, heard, True, "", now=12.0, bound_s=BOUND_S).reason == (
        "rank 0 found a rank gone"
    )
    assert "store on rank 0's node is gone (Connection reset by peer)" in (
        judge(2, 4, heard, False, "Connection reset by peer", now=12.0, bound_s=BOUND_S).reason
    )
    assert judge(2, 4, heard, False, "", now=19.5, bound_s=BOUND_S).reason == (
        "rank 0 gave no sign of life for 10s"
    )
    # only rank 0 is watched: the others' silence is rank 0's to judge
    assert not judge(2, 4, heard, False, "", now=19.0, bound_s=BOUND_S)


class Exits:
    """What a watch's ``leave`` was called with."""

    def __init__(self) -> None:
        self.codes: list[int] = []
        self.left = threading.Event()

    def __call__(self, code: int) -> None:
        self.codes.append(code)
        self.left.set()


def _watches(port: int, world_size: int, bound_s: float) -> list[tuple[StartWatch, Exits]]:
    made = []
    for rank in range(world_size):
        env = DistEnv(rank=rank, world_size=world_size, launched=True, run_id="uid")
        exits = Exits()
        made.append((StartWatch(env, ("127.0.0.1", port), bound_s, leave=exits), exits))
    return made


def _serve() -> tuple[int, TCPStore]:
    """A store served by this process, as torchrun's agent serves its workers'."""
    port = free_port()
    return port, open_store("127.0.0.1", port, 5.0, serve=True)


@pytest.mark.timeout(60)
def test_a_rank_that_stops_beating_fails_rank_0_then_the_others() -> None:
    port, store = _serve()
    # a count an earlier round left behind is no sign of life in this one
    store.add("ddp_trainer/start/uid/beats/2", 40)
    store.add("ddp_trainer/start/uid/failed", 3)
    watches = _watches(port, 3, 1.5)
    (_, zero_exits), (_, one_exits), (two, two_exits) = watches
    for watch, _ in watches:
        watch.start()
    assert not zero_exits.left.wait(4.0)  # all beat: nobody fails, whatever the old counts
    assert [e.codes for _, e in watches] == [[], [], []]
    two.close()  # its beats stop, as a frozen machine's would
    assert zero_exits.left.wait(10), "rank 0 did not notice rank 2's silence"
    assert one_exits.left.wait(10), "rank 1 did not learn of it from rank 0"
    assert zero_exits.codes == one_exits.codes == [EXIT_PEER_LOST]
    assert int(store.add("ddp_trainer/start/uid/failed", 0)) == 4
    assert two_exits.codes == []
    for watch, _ in watches:
        watch.close()


@pytest.mark.timeout(60)
def test_a_closed_watch_fails_nobody() -> None:
    port, _store = _serve()
    watches = _watches(port, 2, 1.0)
    for watch, _ in watches:
        watch.start()
    wait_until(lambda: all(w.silence.seen for w, _ in watches), 10, "both watches reading")
    for watch, _ in watches:
        watch.close()  # every rank past its start: the beats stop, and nobody judges them
    assert not any(exits.left.wait(3.0) for _, exits in watches)


@pytest.mark.timeout(60)
def test_a_rank_whose_store_is_gone_fails_at_once() -> None:
    port, store = _serve()
    ((watch, exits),) = _watches(port, 2, 30.0)[1:]  # rank 1 alone: rank 0 never beats
    watch.start()
    wait_until(lambda: watch.silence.seen, 10, "rank 1's first read")
    del store  # the agent on rank 0's node ends: its store with it
    assert exits.left.wait(10), "rank 1 did not notice its store was gone"
    assert watch.store_error
    watch.close()


@pytest.mark.timeout(60)
def test_a_frozen_store_is_silence_to_the_watch(launcher: Launcher) -> None:
    """Rank 0's node frozen (SIGSTOP of the process serving the store): the store answers
    nothing, the poller's call never returns, and the judge fails the worker within the bound
    all the same (it never waits on the poller, whichever call blocks)."""
    server, endpoint = launcher.store()  # the test's own store process (the launcher ends it)
    ((watch, exits),) = _watches(split_endpoint(endpoint)[1], 2, 2.0)[1:]  # rank 1, of rank 0
    watch.start()
    wait_until(lambda: watch.silence.seen, 10, "rank 1's first read")
    server.freeze_tree()
    assert exits.left.wait(15), "rank 1 did not notice its store was frozen"
    assert exits.codes == [EXIT_PEER_LOST] and not watch.store_error  # silence, no error
    watch.close()


def test_no_watch_where_nothing_is_shorter_than_pg_timeout(monkeypatch) -> None:
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    pair = DistEnv(rank=0, world_size=2, launched=True)
    assert watch_start(DistEnv(), TrainerConfig()) is None  # not torchrun's
    assert watch_start(DistEnv(rank=0, world_size=1, launched=True), TrainerConfig()) is None
    assert watch_start(pair, TrainerConfig(step_timeout_s=0)) is None  # pgTimeoutS throughout
    monkeypatch.delenv("MASTER_ADDR")
    assert watch_start(pair, TrainerConfig()) is None  # no store to beat in
