"""Progress: the record and its rate limit (pure), metrics lines, best-effort reporting."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ddp_trainer.reporting import progress
from ddp_trainer.reporting.progress import (
    ProgressReporter,
    interval_from_env,
    progress_record,
    reporting_target,
    should_report,
)
from ddp_trainer.reporting.run_log import TAIL_BYTES, RunLog, read_run_log


def test_the_record_has_the_status_progress_fields() -> None:
    record = progress_record(
        epoch=2,
        step=40,
        total_steps=100,
        loss=0.5,
        samples_per_second=1234.5678,
        last_checkpoint="step-00000040.pt",
        world_size=4,
        now=0.0,
    )
    assert record == {
        "epoch": 2,
        "step": 40,
        "totalSteps": 100,
        "loss": 0.5,
        "samplesPerSecond": 1234.568,
        "lastCheckpoint": "step-00000040.pt",
        "updatedAt": "1970-01-01T00:00:00Z",
        "worldSize": 4,
        "heldAtStep": None,
    }
    sent = json.loads(progress.configmap_patch(record)["data"]["progress"])
    assert sent == record  # the ConfigMap carries it whole, nulls included


@pytest.mark.parametrize("loss", [float("nan"), float("inf"), float("-inf")])
def test_a_loss_that_is_no_finite_number_is_reported_as_null(loss: float) -> None:
    """JSON has no NaN: the API server would refuse the whole patch, step and all."""
    record = progress_record(
        epoch=0, step=9, total_steps=9, loss=loss, samples_per_second=1.0,
        last_checkpoint=None, world_size=2, now=0.0,
    )  # fmt: skip
    assert record["loss"] is None and record["step"] == 9
    progress.configmap_patch(record)  # JSON without NaN: what the API server accepts


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
    log = RunLog(tmp_path)
    log.write("step", step=1, loss=2.0)
    log.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"event": "st')
    (line,) = read_run_log(tmp_path)
    assert line["step"] == 1 and line["event"] == "step"


def test_a_new_writer_reads_the_newest_step_line_from_the_run_logs_tail(tmp_path: Path) -> None:
    """What PerStep mode's next writer reads back (``Tally.catch_up``): the newest step line's
    step, whoever wrote it (another process's lines after its own), only the file's tail read,
    a torn line or other events between them skipped."""
    mine, other = RunLog(tmp_path), RunLog(tmp_path)
    assert mine.last_step() is None  # a new run: no step yet
    for step in range(1, 3000):  # more than TAIL_BYTES of lines
        mine.write("step", step=step, loss=1.0, group=0)
    other.write("step", step=3000, loss=1.0, group=1)
    other.write("checkpoint", step=3000)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"event": "step", "st')
    assert (tmp_path / "metrics.jsonl").stat().st_size > TAIL_BYTES
    assert mine.last_step() == 3000
    mine.close()
    other.close()


def test_reporting_without_a_cluster_never_blocks(monkeypatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    reporter = ProgressReporter("job", "default", interval_s=0.0)
    for step in range(100):
        reporter.offer({"step": step})
    reporter.close(timeout_s=60)
    assert reporter.sent == 0 and not reporter.running  # gave up at once: nothing to send to
    assert reporter.sent == 0


class RecordingClient:
    """Stands in for the API server's ConfigMap endpoint: records what the reporter sends."""

    def __init__(self, fail_first: int = 0) -> None:
        self.sent: list[dict] = []
        self.fail_first = fail_first

    def patch_progress(self, namespace: str, job: str, record: dict) -> None:
        if self.fail_first:
            self.fail_first -= 1
            raise ConnectionError("apiserver not reachable yet")
        self.sent.append(record)


def reporter_with(monkeypatch, client: RecordingClient, interval_s: float) -> ProgressReporter:
    monkeypatch.setattr(progress, "progress_writer", lambda environ: client)
    return ProgressReporter("job", "default", interval_s=interval_s)


def sent(client: RecordingClient, count: int) -> list[dict]:
    deadline = time.monotonic() + 30
    while len(client.sent) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return client.sent


def test_rate_limited_reports_and_the_final_one_all_arrive(monkeypatch) -> None:
    client = RecordingClient()
    reporter = reporter_with(monkeypatch, client, interval_s=3600)
    reporter.offer({"step": 1})
    assert sent(client, 1) == [{"step": 1}]  # the first report goes at once
    for step in range(2, 50):  # within the interval: only the newest is kept, not sent
        reporter.offer({"step": step})
    reporter.offer({"step": 50}, final=True)
    reporter.close()
    assert [p["step"] for p in client.sent] == [1, 50]


def test_an_urgent_report_skips_the_rate_limit(monkeypatch) -> None:
    client = RecordingClient()
    reporter = reporter_with(monkeypatch, client, interval_s=3600)
    reporter.offer({"step": 1})
    assert sent(client, 1) == [{"step": 1}]
    reporter.offer({"step": 25, "heldAtStep": 25}, urgent=True)
    assert sent(client, 2) == [{"step": 1}, {"step": 25, "heldAtStep": 25}]
    reporter.close()


def test_a_failed_final_report_is_sent_again(monkeypatch) -> None:
    client = RecordingClient(fail_first=1)
    reporter = reporter_with(monkeypatch, client, interval_s=3600)
    reporter.offer({"step": 7}, final=True)
    reporter.close()
    assert client.sent == [{"step": 7}]


def test_in_cluster_writer_needs_the_service_account_token(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(progress, "SA_DIR", tmp_path)
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert progress.InClusterProgressWriter.from_env(env) is None  # no token mounted
    assert progress.InClusterProgressWriter.from_env({}) is None
    with pytest.raises(RuntimeError, match="KUBECONFIG is not set"):
        progress.progress_writer({})


def test_rank_0_writes_into_its_own_pod_when_the_operator_says_so() -> None:
    pod = {"DDPJOB_PROGRESS_INTO": "pod", "POD_NAME": "j-node-1", "HOSTNAME": "j-node-1"}
    assert progress.progress_pod(pod) == "j-node-1"
    assert progress.progress_pod({**pod, "POD_NAME": ""}) == "j-node-1"  # the hostname
    assert progress.progress_pod({**pod, "DDPJOB_PROGRESS_INTO": "configmap"}) is None
    assert progress.progress_pod({"POD_NAME": "j-node-1"}) is None  # an earlier operator's pod
    record = {"step": 3, "loss": None}
    # One annotation and nothing else: the admission policy refuses a patch of anything more.
    assert progress.pod_patch(record) == {
        "metadata": {"annotations": {"ddp.dev/progress": '{"step":3,"loss":null}'}}
    }


def test_the_start_line_says_how_the_global_batch_is_split(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from types import SimpleNamespace

    from ddp_trainer.reporting import tally

    config = SimpleNamespace(workload="charlm", global_batch_size=32)
    parts = SimpleNamespace(
        total_steps=92,
        per_epoch=92,
        batches=SimpleNamespace(count=11, accumulation_steps=1),
        precision=SimpleNamespace(label="bfloat16"),
        device="cpu",
    )
    caplog.set_level("INFO", logger="ddp_trainer.trainer")
    tally._log_start(config, SimpleNamespace(world_size=3), parts, None)  # type: ignore[arg-type]
    tally._log_start(config, SimpleNamespace(world_size=1), parts, 3)  # type: ignore[arg-type]
    restart, per_step = (r.getMessage() for r in caplog.records)
    assert "global batch 32 = 3 ranks x 11 (x1 micro-batches)" in restart
    # PerStep: each group is a world of its own; "1 ranks x 11" would not add up to 32.
    assert (
        "global batch 32 = split each step over the quorum's groups (3 now, of 1 ranks" in per_step
    )
