"""SIGTERM at any moment of a 2-node x 2-process run: the ranks agree on the step they stop at.

Two torchrun agents (a dedicated rendezvous store) run four workers that train in rounds
(tests/trainer/sigterm_rounds.py: each round a new Trainer resumes from the last round's checkpoint
in the same process, so a round costs no worker start). Each round sends SIGTERM to each of the four
workers at its own random moment once they train, as agents that stop their workers at different
moments do; the last round signals the two agents instead, at different moments, as the kubelet
does when the pods are deleted, and the workers exit. Every round, every rank must stop after the
same completed step (the last step line of ``metrics.jsonl``), return 143, and rank 0 must leave
that step's checkpoint; nothing may hang.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import time
from pathlib import Path

import pytest
from sigterm_rounds import ENV_ROUNDS
from trainer_harness import Launcher, Proc, events, wait_until

from ddp_devcluster.recipes import digits
from ddp_trainer.launch.supervisor import descendants
from ddp_trainer.state.store import CheckpointStore, checkpoint_name

# Eight rounds in the suite (each a random moment per worker, 32 signals in all);
# DDP_TEST_SIGTERM_ROUNDS=50 makes it a soak (50 rounds took 69 s here on 2026-11-29).
ROUNDS = int(os.environ.get("DDP_TEST_SIGTERM_ROUNDS", "8"))
SETTINGS = digits(
    epochs=100,  # never reached: every round is stopped by SIGTERM
    seed=7,
    checkpointEverySteps=0,  # the only checkpoints are the SIGTERM ones
    checkpointKeep=2,
    logEverySteps=1,  # a step line per step: the last one is the step a round stopped at
    pgTimeoutS=30,
    stepTimeoutS=15,
)
STOPPING = re.compile(r"rank(\d+) WARNING ddp_trainer\.trainer: .*stopping at step (\d+)")


def stops(text: str) -> dict[int, int]:
    """rank -> the step it said it stopped at."""
    return {int(rank): int(step) for rank, step in STOPPING.findall(text)}


def exit_codes(text: str, round_: int) -> dict[int, int]:
    """rank -> the exit code its trainer returned in ``round_`` (sigterm_rounds' lines). Not
    anchored to lines: print writes its text and its newline apart, so two workers sharing the
    agent's output can land on one line ("...exit code 143round 17: rank 3 ...")."""
    pattern = re.compile(rf"round {round_}: rank (\d+) exit code (\d+)")
    return {int(rank): int(code) for rank, code in pattern.findall(text)}


def newest_checkpoint(folder: Path) -> str | None:
    entries = CheckpointStore(folder).entries()
    return entries[-1].name if entries else None


def workers(nodes: list[Proc]) -> list[int]:
    return [pid for node in nodes for pid in descendants(node.popen.pid)]


def os_kill(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # gone: its agent stopped it after a peer
        os.kill(pid, signum)


@pytest.mark.timeout(900)
def test_sigterm_at_any_moment_leaves_the_last_completed_step(launcher: Launcher) -> None:
    ckpt = launcher.workdir / "ckpt"
    ckpt.mkdir()
    _, endpoint = launcher.store()
    nodes = launcher.agents(
        ("node0", "node1"),
        endpoint=endpoint,
        nnodes="2",
        nproc=2,
        settings=SETTINGS,
        checkpoint_dir=ckpt,
        max_restarts=0,  # the workers live through every round
        worker="sigterm_rounds",
        extra_env={ENV_ROUNDS: str(ROUNDS)},
    )
    rng = random.Random(38)
    previous, seen = 0, [0, 0]  # the step of the last round's checkpoint; log lengths read
    for round_ in range(ROUNDS):
        (ckpt / f"go-{round_}").touch()

        def training() -> bool:
            starts = events(ckpt, "start")
            return len(starts) > round_ and any(  # noqa: B023
                s["step"] > previous and s["time"] >= starts[-1]["time"]  # noqa: B023
                for s in events(ckpt, "step")
            )

        wait_until(training, 240, f"round {round_} to train past step {previous}")
        last_round = round_ == ROUNDS - 1
        if last_round:  # to the agents, which forward it to their workers
            targets = [(node.name, node.signal) for node in nodes]
        else:
            pids = workers(nodes)
            assert len(pids) == 4, pids
            targets = [(f"worker {pid}", lambda s, pid=pid: os_kill(pid, s)) for pid in pids]
        start = rng.uniform(0.0, 1.0)
        moments = sorted((start + rng.uniform(0.0, 0.3), name, send) for name, send in targets)
        print(
            f"round {round_}: SIGTERM "
            + ", ".join(f"{name} at {at:.3f}s" for at, name, _ in moments)
            + f" after step {previous + 1}"
        )
        began = time.monotonic()
        for at, _, send in moments:
            time.sleep(max(0.0, at - (time.monotonic() - began)))
            send(signal.SIGTERM)

        def stopped() -> tuple[dict[int, int], dict[int, int]] | None:
            logs = zip(nodes, seen, strict=True)  # noqa: B023
            text = "".join(node.output()[offset:] for node, offset in logs)
            found, codes = stops(text), exit_codes(text, round_)  # noqa: B023
            return (found, codes) if len(found) == 4 and len(codes) == 4 else None

        found, codes = wait_until(stopped, 90, f"round {round_}: every rank to stop")
        if last_round:
            print(f"round {round_}: agents exited {[node.wait(90) for node in nodes]}")
        seen = [len(node.output()) for node in nodes]
        last = max(s["step"] for s in events(ckpt, "step"))
        print(f"round {round_}: ranks stopped at {found}, exit codes {codes}, last step {last}")
        assert found == dict.fromkeys(range(4), last), launcher.logs()
        assert codes == dict.fromkeys(range(4), 143), launcher.logs()
        wait_until(
            lambda: newest_checkpoint(ckpt) == checkpoint_name(last),  # noqa: B023
            60,
            f"round {round_}: the checkpoint of step {last}",
        )
        assert last > previous
        previous = last
