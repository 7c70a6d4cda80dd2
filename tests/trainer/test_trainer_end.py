"""The ranks of a completed run end together without a collective (``ddp_trainer.end_together``): a
peer lost while rank 0 evaluates holds nobody, and a rank 0 lost then holds the others for
``stepTimeoutS``; with the barrier that did this before, either loss held the survivors for
``pgTimeoutS`` (1800 s).

Two nodes under ``ddp_trainer.node``, as the operator's pods run; rank 0's evaluation waits for
a release file (``padded_workload:wait_in_evaluation``), and the node to lose is frozen with
SIGSTOP (a machine gone silent: no FIN, no RST) while it waits."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from padded_workload import six_steps
from trainer_harness import Launcher, Proc, events, node_of

STEP_TIMEOUT_S = 10
SETTINGS = six_steps(
    "padded_workload:wait_in_evaluation", evaluate=True, stepTimeoutS=STEP_TIMEOUT_S
)


def _two_nodes_at_rank_0s_evaluation(launcher: Launcher) -> tuple[Path, Path, Proc, Proc]:
    """The checkpoint folder, the release file, rank 0's node and the other, once rank 0 waits
    in its evaluation."""
    ckpt, marker, release = (launcher.workdir / n for n in ("ckpt", "evaluating", "release"))
    _, endpoint = launcher.store()
    env = {"EVAL_MARKER": str(marker), "EVAL_RELEASE": str(release), "DDPJOB_EXIT_BARRIER_S": "5"}

    def node(name: str) -> Proc:
        return launcher.node(
            name, endpoint=endpoint, nnodes="2:2", settings=SETTINGS, checkpoint_dir=ckpt,
            rdzv_id="job-uid", supervised=True, extra_env=env,
        )  # fmt: skip

    nodes = [node("node-0"), node("node-1")]
    rank0 = node_of(marker, nodes, 240, "rank 0's evaluation")
    (other,) = [n for n in nodes if n is not rank0]
    return ckpt, release, rank0, other


@pytest.mark.timeout(300)
def test_a_peer_lost_while_rank_0_evaluates_holds_nobody(launcher: Launcher) -> None:
    ckpt, release, rank0, peer = _two_nodes_at_rank_0s_evaluation(launcher)
    peer.freeze_tree()
    release.touch()
    # rank 0 ends at once; its agent then waits DDPJOB_EXIT_BARRIER_S for the frozen one's
    assert rank0.wait(90) == 0, rank0.tail()
    (end,) = [e for e in events(ckpt, "end") if e["rank"] == 0]
    assert "testAccuracy" in end, end  # the evaluation's results
    peer.kill_tree()


@pytest.mark.timeout(300)
def test_rank_0_lost_while_it_evaluates_holds_the_others_for_the_step_timeout(
    launcher: Launcher,
) -> None:
    ckpt, _, rank0, other = _two_nodes_at_rank_0s_evaluation(launcher)
    rank0.freeze_tree()
    frozen = time.monotonic()
    assert other.wait(120) == 0, other.tail()
    waited = time.monotonic() - frozen
    assert "rank 0 gave no sign of life" in other.output(), other.tail()
    assert events(ckpt, "end") == []  # rank 0 writes the run log: its end never came
    rank0.kill_tree()
    print(f"the survivor ended {waited:.1f}s after rank 0 froze (stepTimeoutS {STEP_TIMEOUT_S})")
