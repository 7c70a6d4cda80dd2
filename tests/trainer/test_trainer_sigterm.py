"""SIGTERM at any moment of a 2-node x 2-process run: the ranks agree on the step they stop at.

Each round starts two torchrun agents (a dedicated rendezvous store, resuming from the previous
round's checkpoint), waits until they train, then sends SIGTERM to the two agents at different
moments (random, printed): the agents forward it to their workers at different steps. Every
worker must stop after the same completed step, rank 0 must leave that step's checkpoint, and
both agents must exit without a hang.
"""

from __future__ import annotations

import random
import re
import signal
import time

import pytest
from trainer_harness import Launcher, events, wait_until

from ddp_trainer.checkpoint import CheckpointStore, checkpoint_name

ROUNDS = 20
SETTINGS = {
    "workload": "digits",
    "epochs": 100,  # never reached: every round is stopped by SIGTERM
    "globalBatchSize": 64,
    "amp": "off",
    "seed": 7,
    "checkpointEverySteps": 0,  # the only checkpoints are the SIGTERM ones
    "checkpointKeep": 2,
    "logEverySteps": 1,  # a step line per step: the last one is the step a round stopped at
    "evaluate": False,
    "pgTimeoutS": 30,
    "stepTimeoutS": 15,
}
STOPPING = re.compile(r"rank(\d+) WARNING ddp_trainer\.trainer: .*stopping at step (\d+)")


def stops(log: str) -> dict[int, int]:
    """rank -> the step it said it stopped at."""
    return {int(rank): int(step) for rank, step in STOPPING.findall(log)}


@pytest.mark.timeout(900)
def test_sigterm_at_any_moment_leaves_the_last_completed_step(launcher: Launcher) -> None:
    ckpt = launcher.workdir / "ckpt"
    _, endpoint = launcher.store()
    rng = random.Random(38)
    store = CheckpointStore(ckpt)
    previous = 0
    for round_ in range(ROUNDS):
        nodes = [
            launcher.node(
                f"r{round_}-node{i}",
                endpoint=endpoint,
                nnodes="2",
                nproc=2,
                settings=SETTINGS,
                checkpoint_dir=ckpt,
                is_host=False,
                rdzv_id=f"round-{round_}",
                max_restarts=0,
            )
            for i in range(2)
        ]

        def training() -> bool:
            return any(s["step"] > previous for s in events(ckpt, "step"))  # noqa: B023

        wait_until(training, 240, f"round {round_} to train past step {previous}")
        first_delay, gap = rng.uniform(0.0, 1.5), rng.uniform(0.0, 0.3)
        order = rng.sample(nodes, 2)
        print(
            f"round {round_}: SIGTERM {order[0].name} {first_delay:.3f}s after step "
            f"{previous + 1}, {order[1].name} {gap:.3f}s later"
        )
        time.sleep(first_delay)
        order[0].signal(signal.SIGTERM)
        time.sleep(gap)
        order[1].signal(signal.SIGTERM)
        codes = [node.wait(90) for node in nodes]  # a hang fails here
        logs = "".join(node.output() for node in nodes)

        last = max(s["step"] for s in events(ckpt, "step"))
        stopped = stops(logs)
        newest = store.entries()[-1] if store.entries() else None
        print(f"round {round_}: agents {codes}, ranks stopped at {stopped}, last step {last}")
        assert stopped == dict.fromkeys(range(4), last), launcher.logs()
        assert newest is not None and newest.name == checkpoint_name(last), launcher.logs()
        assert last > previous
        previous = last
