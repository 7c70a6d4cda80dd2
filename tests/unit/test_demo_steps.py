"""`make demo`'s decisions without a cluster: why it cannot start, the checkpoint check, where
the job's pods ran."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_devcluster import demo
from ddp_devcluster.demo import checkpoint_problem, example_documents, pod_machines
from ddp_devcluster.kind import cluster as kind


def test_demo_says_why_it_cannot_start_the_kind_cluster(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(kind, "requirements", lambda: "not running as root (kind's nodes ...)")
    assert demo.main(["--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "kind cluster of four machines" in err and "not running as root" in err
    assert "sudo make demo" in err
    assert not (tmp_path / "out").exists()  # nothing was started or written


def test_checkpoint_problem() -> None:
    rows = [{"event": "checkpoint", "name": "step-00000020.pt"}]
    rows += [{"event": "checkpoint", "name": "step-00000066.pt"}]
    assert checkpoint_problem(rows, {"latest": "step-00000066.pt"}) == ""
    assert "step-00000066.pt" in checkpoint_problem(rows, {"latest": "step-00000020.pt"})
    assert checkpoint_problem(rows, None) == "the volume has no manifest.json"
    assert checkpoint_problem([], {"latest": "x"}) == "the trainer logged no checkpoint"


def test_the_examples_are_applied_as_they_are_but_for_the_progress_interval() -> None:
    docs = example_documents("2")
    claims = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    assert {c["spec"]["accessModes"][0] for c in claims} == {"ReadWriteMany"}  # every machine
    (job,) = [d for d in docs if d["kind"] == "DDPJob"]
    assert job["spec"]["template"]["env"] == [{"name": "DDPJOB_PROGRESS_INTERVAL_S", "value": "2"}]


def test_pod_machines_name_each_pod_s_machine_in_order() -> None:
    pods = {
        "digits-node-1": {"spec": {"nodeName": "ddp-worker2"}},
        "digits-node-0": {"spec": {"nodeName": "ddp-worker"}},
        "digits-rdzv": {"spec": {}},
    }
    assert pod_machines(pods) == [
        "digits-node-0  ddp-worker",
        "digits-node-1  ddp-worker2",
        "digits-rdzv  (not scheduled)",
    ]
