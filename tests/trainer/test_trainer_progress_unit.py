"""Progress: the status patch and its rate limit (pure), metrics lines, best-effort reporting."""

from __future__ import annotations

import time
from pathlib import Path

from ddp_trainer.progress import (
    MetricsLog,
    ProgressReporter,
    interval_from_env,
    progress_patch,
    read_metrics,
    reporting_target,
    should_report,
)


def test_patch_body_has_the_status_progress_fields() -> None:
    patch = progress_patch(
        epoch=2,
        step=40,
        total_steps=100,
        loss=0.5,
        samples_per_second=1234.5678,
        last_checkpoint="step-00000040.pt",
        world_size=4,
        now=0.0,
    )
    assert patch == {
        "status": {
            "progress": {
                "epoch": 2,
                "step": 40,
                "totalSteps": 100,
                "loss": 0.5,
                "samplesPerSecond": 1234.568,
                "lastCheckpoint": "step-00000040.pt",
                "updatedAt": "1970-01-01T00:00:00Z",
                "worldSize": 4,
            }
        }
    }


def test_rate_limit() -> None:
    assert should_report(100.0, None, 10.0, final=False)
    assert not should_report(105.0, 100.0, 10.0, final=False)
    assert should_report(110.0, 100.0, 10.0, final=False)
    assert should_report(101.0, 100.0, 10.0, final=True)


def test_target_and_interval_from_env() -> None:
    assert reporting_target({}) is None
    assert reporting_target({"DDPJOB_NAME": "a"}) is None
    assert reporting_target({"DDPJOB_NAME": "a", "DDPJOB_NAMESPACE": "ns"}) == ("a", "ns")
    assert interval_from_env({}) == 10.0
    assert interval_from_env({"DDPJOB_PROGRESS_INTERVAL_S": "2.5"}) == 2.5
    assert interval_from_env({"DDPJOB_PROGRESS_INTERVAL_S": "soon"}) == 10.0


def test_metrics_lines_survive_a_torn_tail(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path)
    log.write("step", step=1, loss=2.0)
    log.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"event": "st')
    (line,) = read_metrics(tmp_path)
    assert line["step"] == 1 and line["event"] == "step"


def test_reporting_without_a_cluster_never_blocks(monkeypatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    reporter = ProgressReporter("job", "default", interval_s=0.0)
    started = time.monotonic()
    for step in range(100):
        reporter.offer({"status": {"progress": {"step": step}}})
    reporter.close(timeout_s=5)
    assert time.monotonic() - started < 5
    assert reporter.sent == 0
