"""Warm workers (``ddp_trainer.launch.warm``): torchrun's agent forks ddp_trainer's workers from
itself, at the first start and at a restart, and they train, stop and fail as fresh ones do."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from trainer_harness import Launcher, events, free_port, wait_until

from ddp_trainer.hold import release
from ddp_trainer.launch.warm import enabled, runs_trainer, worker_args

SETTINGS = {
    "workload": "digits",
    "epochs": 1,
    "globalBatchSize": 64,
    "amp": "off",
    "checkpointEverySteps": 2,
    "logEverySteps": 1,
    "evaluate": False,
    "maxSteps": 8,
    "holdAtSteps": [3, 6],
}


def children(pid: int) -> dict[int, str]:
    """Pid -> command line of the processes whose parent is ``pid``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                found[int(entry.name)] = (entry / "cmdline").read_bytes().decode()
        except (OSError, ValueError):
            continue
    return found


def test_only_the_bundled_trainer_without_a_gpu_starts_warm() -> None:
    py = "/venv/bin/python"
    assert worker_args([py, "-u", "-m", "ddp_trainer", "--checkpoint-dir", "/c"], py) == [
        "--checkpoint-dir",
        "/c",
    ]
    assert worker_args([py, "-m", "ddp_trainer"], py) == []
    assert worker_args([py, "-u", "-m", "ddp_trainer.node"], py) is None
    assert worker_args([py, "-u", "train.py"], py) is None
    assert worker_args(["numactl", "--cpunodebind=0", py, "-u", "-m", "ddp_trainer"], py) is None
    assert worker_args(["/other/python", "-u", "-m", "ddp_trainer"], py) is None

    assert runs_trainer(["--nnodes=2", "--module", "ddp_trainer", "--checkpoint-dir", "/c"])
    assert runs_trainer(["--standalone", "-m", "ddp_trainer"])
    assert not runs_trainer(["--nnodes=2", "/work/train.py", "ddp_trainer"])
    assert not runs_trainer(["-m", "own_script", "--module", "x"])

    assert enabled({}, gpus=[])
    assert not enabled({}, gpus=["/dev/nvidia0"])
    assert enabled({"DDPJOB_WARM_WORKERS": "1"}, gpus=["/dev/nvidia0"])
    assert not enabled({"DDPJOB_WARM_WORKERS": "0"}, gpus=[])
    assert not enabled({"DDPJOB_WARM_WORKERS": "false"}, gpus=[])
    assert not enabled({"DDPJOB_WARM_WORKERS": "yes please"}, gpus=["/dev/nvidia0"])  # warned


@pytest.mark.timeout(240)
def test_workers_are_forked_at_start_and_at_a_restart_and_finish(launcher: Launcher) -> None:
    ckpt = launcher.workdir / "ckpt"
    node = launcher.node(
        "warm",
        endpoint=f"127.0.0.1:{free_port()}",
        nnodes="1",
        nproc=2,
        is_host=True,
        settings=SETTINGS,
        checkpoint_dir=ckpt,
        max_restarts=1,
    )
    agent = node.popen.pid

    wait_until(lambda: events(ckpt, "hold"), 120, "the hold after step 3")
    agent_cmdline = Path(f"/proc/{agent}/cmdline").read_bytes().decode()
    first = children(agent)
    # Two workers, each a fork of the agent: its command line, not `python -u -m ddp_trainer`.
    assert len(first) == 2 and set(first.values()) == {agent_cmdline}, (first, agent_cmdline)
    assert "ddp_trainer.launch.warm" in agent_cmdline
    # Each in a session of its own, as torchrun's Popen starts them (it signals their group).
    assert all(os.getsid(pid) == pid for pid in first)

    os.kill(min(first), signal.SIGKILL)  # a worker lost: the agent stops the other, restarts
    release(ckpt, 3)
    wait_until(lambda: len(events(ckpt, "hold")) >= 2, 120, "the restarted workers' hold at 6")
    again = children(agent)
    assert len(again) == 2 and set(again.values()) == {agent_cmdline}, again
    assert not set(again) & set(first)
    starts = events(ckpt, "start")
    assert len(starts) == 2 and starts[1]["resumedFrom"] == "step-00000002.pt", starts
    release(ckpt, 6)

    assert node.wait(120) == 0, node.tail()
    assert [s["step"] for s in events(ckpt, "step")][-1] == 8


@pytest.mark.timeout(120)
def test_a_warm_workers_exit_code_reaches_torchrun(launcher: Launcher) -> None:
    """Settings the trainer refuses: it exits 2 before training, and torchrun reports that."""
    node = launcher.standalone(
        "refused", nproc=1, settings={"workload": "nope"}, checkpoint_dir=launcher.workdir / "c"
    )
    assert node.wait(90) == 1, node.tail()
    out = node.output()
    assert "ddp_trainer: invalid settings" in out and "workload" in out
    assert "exitcode  : 2" in out, node.tail()
