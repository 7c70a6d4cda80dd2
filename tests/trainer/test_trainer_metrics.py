"""Prometheus metrics of real runs: every node's endpoint scraped at a hold point and parsed with
the Prometheus text parser; port 0 serves nothing; a taken port does not stop training."""

from __future__ import annotations

import math
import os
import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from trainer_harness import Launcher, events, free_port, wait_until

from ddp_trainer.hold import release

# No labels of our own: Prometheus adds namespace and pod. A histogram's buckets carry `le`.
ALLOWED_LABELS = {"le"}
SETTINGS = {
    "workload": "digits",
    "epochs": 1,
    "maxSteps": 10,
    "globalBatchSize": 64,
    "amp": "off",
    "checkpointEverySteps": 5,
    "logEverySteps": 2,
    "evaluate": False,
    "holdAtSteps": [6],
    "pgTimeoutS": 60,
}


def scrape(port: int) -> dict[str, float]:
    """{sample name: value} of one endpoint (histograms: their +Inf bucket, count and sum),
    after checking that every family has HELP text and no label beyond the allowed ones."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    values = {}
    for family in text_string_to_metric_families(text):
        assert family.documentation, f"{family.name} has no HELP text"
        assert family.name.startswith("ddp_trainer_"), family.name
        for sample in family.samples:
            assert set(sample.labels) <= ALLOWED_LABELS, sample
            if sample.labels.get("le", "+Inf") == "+Inf":
                values[sample.name] = sample.value
    return values


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on, from /proc (its sockets in state LISTEN)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


@pytest.mark.timeout(300)
def test_each_node_serves_its_metrics_while_training(launcher: Launcher) -> None:
    ckpt = launcher.workdir / "ckpt"
    endpoint = f"127.0.0.1:{free_port()}"
    # In a cluster every node is a pod with the same port; on one host each needs its own.
    ports = [free_port(), free_port()]
    nodes = [
        launcher.node(
            f"node{i}",
            endpoint=endpoint,
            nnodes="2",
            nproc=2,  # two processes per node: only the first may bind the node's port
            settings={**SETTINGS, "metricsPort": ports[i]},
            checkpoint_dir=ckpt,
            is_host=i == 0,
            max_restarts=0,
        )
        for i in range(2)
    ]
    wait_until(lambda: events(ckpt, "hold"), 180, "the hold after step 6")
    # Step 5's checkpoint is written in the background: wait for it, never for a duration.
    by_port = wait_until(
        lambda: {
            port: values
            for port in ports
            if (values := scrape(port)).get("ddp_trainer_last_checkpoint_step", 0) == 5
        },
        60,
        "step 5's checkpoint in the metrics",
        every=0.2,
    )
    (main_port,) = by_port  # global rank 0 is on one of the nodes, and only it checkpoints
    (other_port,) = set(ports) - {main_port}
    main, other = scrape(main_port), scrape(other_port)

    for values in (main, other):
        assert values["ddp_trainer_step"] == 6
        assert values["ddp_trainer_total_steps"] == 10
        assert values["ddp_trainer_epoch"] == 0
        assert values["ddp_trainer_world_size"] == 4
        assert values["ddp_trainer_worker_restarts"] == 0
        assert values["ddp_trainer_step_seconds_count"] == 6  # this process's steps
        assert values["ddp_trainer_step_seconds_sum"] > 0
        assert math.isfinite(values["ddp_trainer_loss"]) and values["ddp_trainer_loss"] > 0
        assert values["ddp_trainer_learning_rate"] > 0
        assert values["ddp_trainer_samples_per_second"] > 0
    # The loss is all-reduced and the LR a function of the step: both nodes say the same.
    assert other["ddp_trainer_loss"] == pytest.approx(main["ddp_trainer_loss"])
    assert other["ddp_trainer_learning_rate"] == main["ddp_trainer_learning_rate"]

    size = (ckpt / "step-00000005.pt").stat().st_size
    assert main["ddp_trainer_checkpoint_bytes"] == size
    assert main["ddp_trainer_checkpoint_seconds_count"] == 1
    assert main["ddp_trainer_checkpoint_blocked_seconds_count"] == 1
    assert not any(name.startswith("ddp_trainer_checkpoint") for name in other)
    assert "ddp_trainer_last_checkpoint_step" not in other

    release(ckpt, 6)
    for node in nodes:
        assert node.wait(120) == 0, launcher.logs()
    # The second process of each node never tried the port its first process holds.
    assert "cannot serve Prometheus metrics" not in launcher.logs()


@pytest.mark.timeout(240)
def test_port_zero_serves_nothing_and_a_taken_port_does_not_stop_training(
    launcher: Launcher,
) -> None:
    short = {**SETTINGS, "maxSteps": 4, "holdAtSteps": []}
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))  # what the trainer binds, so the port is surely taken
        taken.listen()
        port = taken.getsockname()[1]
        assert port in listening_ports(os.getpid())  # the /proc reading sees a listener

        off_dir, busy_dir = launcher.workdir / "off", launcher.workdir / "busy"
        off = launcher.alone(
            "off", settings={**short, "metricsPort": 0, "holdAtSteps": [2]}, checkpoint_dir=off_dir
        )
        busy = launcher.alone(
            "busy", settings={**short, "metricsPort": port}, checkpoint_dir=busy_dir
        )

        wait_until(lambda: events(off_dir, "hold"), 180, "the hold after step 2")
        assert listening_ports(off.popen.pid) == set()
        release(off_dir, 2)
        assert off.wait(120) == 0, off.tail()

        assert busy.wait(180) == 0, busy.tail()
        (end,) = events(busy_dir, "end")
        assert end["step"] == 4
        assert busy.output().count(f"cannot serve Prometheus metrics on port {port}") == 1
    assert "Prometheus" not in off.output()
