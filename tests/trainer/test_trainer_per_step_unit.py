"""PerStep mode's pure decisions: a pod's group from its environment, the split of a step's
global batch over the participating groups and their local ranks, the weighting that makes any
split's update the full batch's mean, when a checkpoint is loaded instead of a peer's state, and
the quorum ids torchft is given."""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from pathlib import Path

import pytest
import torch
from trainer_harness import wait_until

from ddp_trainer.data.batching import Position, batch_share, position_after
from ddp_trainer.data.sampler import global_order, step_indices
from ddp_trainer.per_step.beats import Beats, read_beats
from ddp_trainer.per_step.group import no_nccl_dumps, quiet_torchft
from ddp_trainer.per_step.hooks import StopAt
from ddp_trainer.per_step.replicas import (
    GroupSettings,
    QuorumIds,
    beat_window_s,
    loads_checkpoint,
    mean_divisor,
    micro_split,
    participant_share,
    per_step,
    run_id,
    share_weights,
    trained_elsewhere,
    url_host,
    whole_batch,
)
from ddp_trainer.reporting.progress import progress_record

POD = {
    "DDPJOB_FAULT_TOLERANCE": "PerStep",
    "TORCHFT_LIGHTHOUSE": "http://job-lighthouse.ns.svc:29510",
    "REPLICA_GROUP_ID": "2",
    "NUM_REPLICA_GROUPS": "4",
    "DDPJOB_MIN_GROUPS": "2",
    "DDPJOB_GROUP_TIMEOUT_S": "7.5",
    "DDPJOB_NAME": "job",
    "POD_IP": "fd00::12",
}


def test_a_pod_is_the_replica_group_its_environment_names() -> None:
    g = GroupSettings.from_env(POD)
    assert (
        per_step(POD) and not per_step({}) and not per_step({"DDPJOB_FAULT_TOLERANCE": "Restart"})
    )
    assert (g.group, g.replica_id, g.groups_hint, g.min_groups) == (2, "job-2", 4, 2)
    assert (g.timeout_s, g.host, g.lighthouse) == (7.5, "fd00::12", POD["TORCHFT_LIGHTHOUSE"])
    assert g.quorum_timeout_s >= 3 * g.timeout_s
    assert url_host(g.host) == "[fd00::12]" and url_host("10.0.0.3") == "10.0.0.3"
    defaults = GroupSettings.from_env(
        {k: POD[k] for k in ("TORCHFT_LIGHTHOUSE", "REPLICA_GROUP_ID")}
    )
    assert (defaults.groups_hint, defaults.min_groups, defaults.timeout_s) == (1, 1, 30.0)


@pytest.mark.parametrize(
    ("drop", "change", "names"),
    [
        ("TORCHFT_LIGHTHOUSE", {}, "TORCHFT_LIGHTHOUSE"),
        ("REPLICA_GROUP_ID", {}, "REPLICA_GROUP_ID"),
        (None, {"DDPJOB_GROUP_TIMEOUT_S": "soon"}, "DDPJOB_GROUP_TIMEOUT_S"),
        (None, {"DDPJOB_MIN_GROUPS": "0"}, "DDPJOB_MIN_GROUPS"),
    ],
)
def test_a_missing_or_bad_setting_is_named(drop, change, names) -> None:
    environ = {k: v for k, v in {**POD, **change}.items() if k != drop}
    with pytest.raises(ValueError, match=names):
        GroupSettings.from_env(environ)


def test_the_completion_record_names_the_job_not_torchruns_random_run_id() -> None:
    assert run_id({"PET_RDZV_ID": "uid-1", "DDPJOB_NAME": "job"}) == "uid-1"
    assert run_id({"DDPJOB_NAME": "job", "TORCHELASTIC_RUN_ID": "random"}) == "job"


@pytest.mark.parametrize(("groups", "nproc"), [(1, 1), (2, 1), (3, 1), (3, 2), (4, 3), (5, 4)])
def test_participants_tile_the_global_batch(groups: int, nproc: int) -> None:
    shares = [
        participant_share(64, groups, g, nproc, r) for g in range(groups) for r in range(nproc)
    ]
    assert shares[0][0] == 0
    assert all(a[0] + a[1] == b[0] for a, b in itertools.pairwise(shares))
    assert sum(count for _, count in shares) == 64
    assert max(c for _, c in shares) - min(c for _, c in shares) <= 1


def test_one_group_of_one_takes_restart_modes_whole_batch() -> None:
    """The reference: a world of one in Restart mode takes the global batch at the cursor."""
    order = global_order(1437, 0, 0)
    (restart,) = step_indices(order, batch_share(64, 1, 0), 128)
    start, count = participant_share(64, 1, 0, 1, 0)
    assert torch.equal(order[128 + start : 128 + start + count], restart)


@pytest.mark.parametrize("steps", [0, 1, 21, 22, 23, 100])
def test_every_split_of_a_step_is_restart_modes_global_batch(steps: int) -> None:
    pos = position_after(Position(0, 0, 0), steps, 64, 1437)
    order = global_order(1437, 7, pos.epoch)
    (whole,) = step_indices(order, batch_share(64, 1, 0), pos.samples_in_epoch)
    for groups, nproc in [(2, 1), (3, 1), (2, 3)]:
        parts = []
        for g, r in itertools.product(range(groups), range(nproc)):
            start, count = participant_share(64, groups, g, nproc, r)
            first = pos.samples_in_epoch + start
            parts.append(order[first : first + count])
        assert torch.equal(torch.cat(parts), whole)


def test_a_batch_smaller_than_the_processes_leaves_some_shares_empty() -> None:
    shares = [participant_share(3, 5, g, 1, 0) for g in range(5)]
    assert [c for _, c in shares] == [1, 1, 1, 0, 0]
    assert participant_share(64, 3, None, 1, 0) == (0, 0)  # not participating: no share
    with pytest.raises(ValueError):
        participant_share(64, 2, 2, 1, 0)


def test_micro_batches_of_a_share_stay_under_the_cap() -> None:
    assert micro_split(0, 8) == ()
    assert micro_split(20, 8) == (6, 7, 7)
    assert micro_split(8, 8) == (8,)
    assert sum(micro_split(33, 4)) == 33 and max(micro_split(33, 4)) <= 4


def test_summed_weighted_gradients_over_any_split_are_the_full_batch_mean() -> None:
    """Each share backpropagates its micro-batches' mean losses weighted by their part of its
    loss terms (``share_weights``): the gradient of the share's mean loss, the size Restart
    mode's ranks backpropagate (not its terms times that, which overflowed fp16's scales). Times
    its ``mean_divisor``, summed over every share, divided by the summed terms: the gradient of
    the whole batch's mean loss, whatever the split."""
    torch.manual_seed(0)
    x, y = torch.randn(60, 5), torch.randn(60)
    w = torch.randn(5, requires_grad=True)

    def loss(idx: torch.Tensor) -> torch.Tensor:
        return ((x[idx] @ w - y[idx]) ** 2).mean()

    (full,) = torch.autograd.grad(loss(torch.arange(60)), w)
    for groups in (1, 2, 3, 4):
        total, terms = torch.zeros(5), 0
        for g in range(groups):
            start, count = participant_share(60, groups, g, 1, 0)
            mine = torch.arange(start, start + count)
            parts = mine.split(list(micro_split(count, 7)))
            weights = share_weights([len(part) for part in parts])
            (grad,) = torch.autograd.grad(
                sum(loss(part) * weight for part, weight in zip(parts, weights, strict=True)), w
            )
            (its_mean,) = torch.autograd.grad(loss(mine), w)
            torch.testing.assert_close(grad, its_mean)
            total += grad * mean_divisor(count)
            terms += count
        assert whole_batch(float(terms), 60)
        torch.testing.assert_close(total / mean_divisor(terms), full)
    assert share_weights([3, 0, 1]) == [0.75, 0.0, 0.25] and share_weights([0, 0]) == [0.0, 0.0]


def test_a_step_missing_a_share_or_holding_one_twice_is_not_whole() -> None:
    assert whole_batch(64.0, 64) and whole_batch(63.9999, 64)
    assert not whole_batch(43.0, 64) and not whole_batch(85.0, 64)
    assert mean_divisor(0) == 1.0  # padding only: zeros, not NaN


def test_quorum_ids_are_new_for_new_members_or_a_new_lighthouse_and_grow_with_the_step() -> None:
    a, b, c, c2 = "job-0:u1", "job-1:u2", "job-2:u3", "job-2:u4"  # c2: group 2 restarted
    ids = QuorumIds()
    first = ids.id_for(1, [a, b, c], max_step=0)
    assert ids.id_for(1, [c, a, b], max_step=7) == first  # the same quorum, steps later
    shrunk = ids.id_for(2, [a, b], max_step=9)
    grown = ids.id_for(3, [a, b, c2], max_step=12)
    assert len({first, shrunk, grown}) == 3 and first < shrunk < grown
    # A new lighthouse numbers its quorums from 1 again: the same lighthouse ids, new job ids.
    again = [ids.id_for(1, [a, b, c2], 30), ids.id_for(2, [a, b], 40)]
    assert again[0] not in (first, grown) and again[1] != shrunk and again == sorted(again)
    # a new quorum that kept this process's last lighthouse id but not its members
    assert ids.id_for(2, [a, c2], 41) != again[1]
    # every member of a quorum computes the same id, whatever it had before
    assert QuorumIds().id_for(2, [c2, a], 41) == ids.id_for(2, [a, c2], 50)
    # A member whose quorum failed takes the next as new, as its members who saw others do.
    ids.forget()
    assert ids.id_for(2, [a, c2], 60) == QuorumIds().id_for(2, [a, c2], 60) != again[1]
    # one tried at the same step with a higher lighthouse id orders after it
    assert QuorumIds().id_for(3, [a], 41) > QuorumIds().id_for(2, [a, c2], 41)


def test_a_checkpoint_is_loaded_only_when_no_live_group_has_trained() -> None:
    assert loads_checkpoint(0)
    assert not loads_checkpoint(1) and not loads_checkpoint(250)


def test_the_progress_record_says_how_many_groups_trained_only_in_per_step_mode() -> None:
    common = dict(epoch=1, step=5, total_steps=9, loss=0.5, samples_per_second=1.0)
    restart = progress_record(**common, last_checkpoint=None, world_size=2, now=0.0)
    assert "groups" not in restart
    perstep = progress_record(**common, last_checkpoint=None, world_size=3, now=0.0, groups=3)
    assert perstep["groups"] == 3 and {**perstep, "groups": None} != restart


def test_a_per_step_pod_of_a_completed_job_exits_0_without_torchrun(tmp_path, monkeypatch) -> None:
    """The node wrapper in PerStep mode: no job-wide store is waited for, and the completion
    record names the job's run id (torchrun standalone's own is random per start)."""
    from ddp_trainer.launch import supervisor
    from ddp_trainer.state.store import CheckpointStore

    CheckpointStore(tmp_path).mark_complete("job-uid", 140, "step-00000140.pt")
    for name, value in {
        "DDPJOB_FAULT_TOLERANCE": "PerStep",
        "PET_RDZV_ID": "job-uid",
        "PET_STANDALONE": "1",
        "PET_RDZV_ENDPOINT": "127.0.0.1:9",  # set or not, nothing waits for a store
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(supervisor, "Torchrun", lambda *a, **k: pytest.fail("torchrun started"))
    monkeypatch.setattr(supervisor, "wait_for_store", lambda *a, **k: pytest.fail("store awaited"))
    args = ["--nproc-per-node=1", "-m", "ddp_trainer", "--checkpoint-dir", str(tmp_path)]
    assert supervisor.supervise(args, None) == 0


def test_a_first_quorum_at_step_0_waits_for_another_group_that_trained_and_beat_lately() -> None:
    window = beat_window_s(2.0)
    assert window == 5.0 and beat_window_s(5.0) == 10.0
    now = 1000.0
    # group 0 trained 40 steps and beat 1 s ago: alive, mid-step
    assert trained_elsewhere({0: (40, now - 1), 1: (0, now)}, 1, now, window) == (40, 1.0)
    # none trained (a new job: every group at step 0), or the beat is old (every group lost)
    assert trained_elsewhere({0: (0, now), 2: (0, now)}, 1, now, window) is None
    assert trained_elsewhere({0: (40, now - 6)}, 1, now, window) is None
    # this group's own beat is its lost incarnation's
    assert trained_elsewhere({1: (40, now)}, 1, now, window) is None


def test_a_groups_beat_is_written_every_second_and_read_back(tmp_path: Path) -> None:
    step = [7]
    beats = Beats(tmp_path, 3, lambda: step[0])
    beats.start()
    try:
        got = wait_until(lambda: read_beats(tmp_path).get(3), 5, "the first beat")
        assert got[0] == 7 and abs(got[1] - time.time()) < 5
        step[0] = 8
        wait_until(lambda: (read_beats(tmp_path).get(3) or (0, 0))[0] == 8, 5, "a beat of step 8")
    finally:
        beats.stop()
    (tmp_path / "groups" / "x.json").write_text("not a beat")
    assert set(read_beats(tmp_path)) == {3}


def test_a_stop_at_a_phase_and_step_holds_only_once_that_many_steps_are_trained(
    tmp_path: Path,
) -> None:
    stop, steps = tmp_path / "stop", [2]
    stop.write_text("quorum@3")
    hold = StopAt(str(stop), lambda: steps[0])
    hold("quorum")  # 2 steps trained: goes on
    hold("forward")
    assert not Path(f"{stop}.reached").exists()
    steps[0] = 3
    waiter = threading.Thread(target=hold, args=("quorum",))
    waiter.start()
    wait_until(lambda: Path(f"{stop}.reached").exists(), 5, "the hold")
    assert waiter.is_alive()  # held while the file names it
    stop.write_text("go")
    waiter.join(5)
    assert not waiter.is_alive()


def test_nccl_dumps_are_off_by_default_and_a_pods_own_setting_wins() -> None:
    """A PerStep process turns torch's NCCL flight-recorder dump, and the wait for it, off before
    it makes any process group; a value from the pod's env (spec.template.env) stays."""
    environ: dict[str, str] = {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    no_nccl_dumps(environ)
    assert environ == {
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "0",
    }
    fresh: dict[str, str] = {}
    no_nccl_dumps(fresh)
    assert fresh == {"TORCH_NCCL_DUMP_ON_TIMEOUT": "0", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "0"}


def test_torchft_errors_at_a_peers_loss_are_one_warning_line_each(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchft's own loggers, as its Manager and checkpoint server call them when a peer is
    lost: after quiet_torchft each error is one WARNING line, its traceback dropped; its INFO
    lines are off."""
    from torchft.manager import ExceptionWithTraceback

    monkeypatch.delenv("RUST_LOG", raising=False)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        quiet_torchft()
        manager = logging.getLogger("torchft.manager")
        try:
            raise RuntimeError("Timed out waiting 5000ms for recv operation to complete")
        except RuntimeError as error:
            wrapped = ExceptionWithTraceback(error)  # its text carries the traceback
            manager.exception(f"[job-1:abc/0 - step 620] got exception waiting for work {wrapped}")
        try:
            raise TimeoutError("Timed out waiting for wlock after 5.0 seconds")
        except TimeoutError:
            logging.getLogger("torchft.checkpointing.http_transport").exception(
                "Exception in checkpoint server when handling self.path='/checkpoint/1132/full'"
            )
        manager.info("[job-1:abc/0 - step 621] reconfiguring")
        logging.getLogger("torchft.other").error("an error elsewhere in torchft stays whole")
    finally:
        root.removeHandler(handler)
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "WARNING torchft.manager: [job-1:abc/0 - step 620] got exception waiting for work"
        " Timed out waiting 5000ms for recv operation to complete",
        "WARNING torchft.checkpointing.http_transport: Exception in checkpoint server when"
        " handling self.path='/checkpoint/1132/full'",
        "ERROR torchft.other: an error elsewhere in torchft stays whole",
    ], err
    assert os.environ["RUST_LOG"] == "warn"  # torchft's Rust side: warnings only
