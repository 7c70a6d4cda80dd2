"""How `kubectl ddp` shows a job, without I/O: progress and outcome (ddp_client.live), merged
logs (ddp_client.loglines), curves (ddp_client.curves)."""

from __future__ import annotations

from ddp_api.contract import duration_text, parse_run_log
from ddp_client.curves import curves
from ddp_client.live import LiveView, exit_code, outcome_line, progress_line
from ddp_client.loglines import (
    LiveMerge,
    LogLine,
    merge_logs,
    parse_pod_log,
    parse_timestamp,
    pick_rank,
    rank_of,
)

SECOND = 1_000_000_000
T0 = parse_timestamp("2026-03-01T10:00:00Z") or 0


def test_progress_line_and_live_view_come_from_status_progress() -> None:
    progress = {
        "epoch": 1,
        "step": 33,
        "totalSteps": 66,
        "loss": 0.51234,
        "samplesPerSecond": 140.2,
        "worldSize": 2,
        "updatedAt": "2026-01-01T00:00:00Z",
    }
    line = progress_line(progress)
    assert line.startswith("[" + "#" * 15 + "-" * 15 + "]")
    assert "epoch 1 step 33/66 loss 0.5123    140 samples/s (world size 2)" in line
    assert progress_line({}) == "[" + "-" * 30 + "] epoch ? step 0/? (world size ?)"
    assert progress_line({**progress, "estimatedRemainingSeconds": 307}).endswith(
        "(world size 2) ETA 5m07s"
    )
    assert [duration_text(s) for s in (-1, 42, 60, 11045, 93784)] == [
        "0s",
        "42s",
        "1m00s",
        "3h04m",
        "1d02h",
    ]

    out: list[str] = []
    view = LiveView(out.append)
    view({"phase": "Pending"})
    pull = {"type": "Pending", "status": "True", "reason": "ImagePullFailed", "message": "x: y"}
    view({"phase": "Pending", "conditions": [pull]})
    view({"phase": "Pending", "conditions": [pull]})  # no change
    view({"phase": "Running", "progress": progress})
    view({"phase": "Running", "progress": {**progress, "updatedAt": "later"}})  # no change
    view({"phase": "Running", "progress": {**progress, "step": 34}})
    ok = {"type": "Succeeded", "status": "True", "message": "all 2 nodes exited 0"}
    view({"phase": "Succeeded", "progress": {**progress, "step": 34}, "conditions": [ok]})
    assert [x.split("]")[0] if x.startswith("  [") else x for x in out] == [
        "  phase Pending\n",
        "  reason ImagePullFailed: x: y\n",
        "  phase Running\n",
        "  [" + "#" * 15 + "-" * 15,
        "  [" + "#" * 15 + "-" * 15,
        "  phase Succeeded: all 2 nodes exited 0\n",
    ]
    assert view.lines == 2

    tty: list[str] = []
    view = LiveView(tty.append, tty=True)
    view({"phase": "Running", "progress": progress})
    view({"phase": "Running", "progress": {**progress, "step": 34, "lastCheckpoint": "x"}})
    view({"phase": "Succeeded", "progress": {**progress, "step": 34, "lastCheckpoint": "y"}})
    view.close()
    assert [x[:7] for x in tty] == ["  phase", "\r\x1b[K  [", "\r\x1b[K  [", "\n", "  phase"]


def test_the_outcome_gives_the_exit_code_and_only_a_finished_job_has_one() -> None:
    assert exit_code("Succeeded") == 0 and exit_code("Failed") == 1
    for phase in (None, "Pending", "Running", "Scaling", "Restarting", "Suspended"):
        assert exit_code(phase) is None


def test_the_last_line_says_how_long_the_job_took_its_start_up_and_its_incidents_cost() -> None:
    status = {
        "phase": "Succeeded",
        "startTime": "2026-11-26T10:00:00Z",
        "completionTime": "2026-11-26T10:01:31Z",
        "firstReportTime": "2026-11-26T10:00:30Z",
        "incidents": [{"kind": "Disruption", "detectedAt": "2026-11-26T10:00:51Z"}],
        "goodput": 0.667,
    }
    assert outcome_line("charlm", status) == (
        "ddpjob charlm Succeeded in 1m31s (start-up 30s; 1 incident, goodput 0.67)"
    )
    failed = {"phase": "Failed", "reason": "BackoffLimitExceeded", "startTime": status["startTime"]}
    assert outcome_line("j", failed) == "ddpjob j Failed: BackoffLimitExceeded"  # never trained
    twice = {**status, "incidents": status["incidents"] * 2, "goodput": 0.5}
    assert outcome_line("j", twice).endswith("(start-up 30s; 2 incidents, goodput 0.50)")


def test_kubelet_timestamps_parse_to_nanoseconds_whatever_their_precision() -> None:
    assert T0 > 0
    assert parse_timestamp("2026-03-01T10:00:00.5Z") == T0 + SECOND // 2
    assert parse_timestamp("2026-03-01T10:00:00.000000001Z") == T0 + 1
    assert parse_timestamp("2026-03-01T10:00:00.123456789Z") == T0 + 123456789
    assert parse_timestamp("2026-03-01T11:00:00.25+01:00") == T0 + SECOND // 4
    # Sorting the text would put "10:00:00Z" after "10:00:00.5Z"; the numbers do not.
    whole, half = parse_timestamp("2026-03-01T10:00:00Z"), parse_timestamp("2026-03-01T10:00:00.5Z")
    assert whole is not None and half is not None and whole < half
    for bad in ("", "hello", "2026-03-01T10:00:00", "2026-03-01T10:00:00.1234567891Z"):
        assert parse_timestamp(bad) is None


def test_a_line_names_the_rank_from_torchruns_prefix_or_the_trainers_format() -> None:
    assert rank_of("[rank3]: step 10 loss 0.5") == (3, "step 10 loss 0.5")
    trainer = "2026-03-01 10:00:00,123 rank1 WARNING ddp_trainer.trainer: slow"
    assert rank_of(trainer) == (1, trainer)
    assert rank_of(f"[rank0]: {trainer}") == (0, trainer)  # the prefix wins
    agent = "I0301 10:00:00.1 12 torch/distributed/run.py:1102] Rendezvous info:"
    assert rank_of(agent) == (None, agent)
    assert rank_of("my rank1 says [rank2]: hi")[0] is None  # only at the start of a line


def pod_log(*lines: str) -> str:
    return "".join(line + "\n" for line in lines)


def test_the_nodes_logs_merge_in_time_order_each_line_prefixed_with_node_and_rank() -> None:
    node0 = parse_pod_log(
        pod_log(
            "2026-03-01T10:00:00.100Z I0301 agent: Rendezvous complete",
            "2026-03-01T10:00:01Z [rank0]: step 1 loss 2.3",
            "2026-03-01T10:00:03Z [rank0]: step 2 loss 2.1",
        ),
        "job-node-0",
        0,
    )
    node1 = parse_pod_log(
        pod_log(
            "2026-03-01T10:00:00.9Z [rank1]: hello from rank 1",
            "2026-03-01T10:00:01Z [rank1]: step 1 on rank 1",
            "2026-03-01T10:00:02.5Z [rank1]: Traceback (most recent call last):",
            "  a continuation without a timestamp",
        ),
        "job-node-1",
        1,
    )
    merged = merge_logs([node0, node1])
    assert [line.show() for line in merged] == [
        "[node-0] I0301 agent: Rendezvous complete",
        "[node-1 rank1] hello from rank 1",
        "[node-0 rank0] step 1 loss 2.3",  # same instant: the lower node first
        "[node-1 rank1] step 1 on rank 1",
        "[node-1 rank1] Traceback (most recent call last):",
        "[node-1]   a continuation without a timestamp",  # keeps its predecessor's time
        "[node-0 rank0] step 2 loss 2.1",
    ]
    assert merged[1].show(timestamps=True) == (
        "2026-03-01T10:00:00.9Z [node-1 rank1] hello from rank 1"
    )
    assert [line.text for line in pick_rank(merged, 1)][:2] == [
        "hello from rank 1",
        "step 1 on rank 1",
    ]
    assert pick_rank(merged, 7) == [] and pick_rank(merged, None) == merged
    unindexed = LogLine(at=0, pod="job-node-9", node=None, rank=None, text="x")
    assert unindexed.show() == "[job-node-9] x"


def line(at_s: float, pod: int, text: str) -> LogLine:
    return LogLine(at=T0 + int(at_s * SECOND), pod=f"j-node-{pod}", node=pod, rank=pod, text=text)


def test_followed_streams_go_out_in_time_order_once_a_line_waited_its_hold() -> None:
    merge = LiveMerge(hold_s=1.0)
    merge.add(line(5.0, 0, "a"), received=100.0)
    assert merge.ready(100.5) == []  # a line of another pod may still come with an earlier time
    merge.add(line(4.0, 1, "b"), received=100.6)  # earlier, but arrived later
    merge.add(line(6.0, 1, "c"), received=100.7)
    assert [x.text for x in merge.ready(101.0)] == ["b", "a"]  # up to a's time
    assert [x.text for x in merge.ready(101.6)] == []  # c waits for its own hold
    assert [x.text for x in merge.ready(101.7)] == ["c"]
    merge.add(line(1.0, 0, "late"), received=102.0)  # later than the hold: out of order
    merge.add(line(9.0, 1, "d"), received=102.0)
    assert [x.text for x in merge.ready(103.0)] == ["late", "d"]
    merge.add(line(8.0, 0, "e"), received=104.0)
    merge.add(line(7.0, 1, "f"), received=104.1)
    assert [x.text for x in merge.flush()] == ["f", "e"] and merge.flush() == []


def test_curves_take_loss_and_lr_by_step_the_last_line_of_a_replayed_step_winning() -> None:
    text = "\n".join(
        [
            '{"event": "start", "step": 0}',
            '{"event": "step", "step": 1, "loss": 2.3, "lr": 0.001}',
            '{"event": "step", "step": 2, "loss": 2.0, "lr": 0.002}',
            '{"event": "checkpoint", "step": 2, "name": "step-00000002.pt"}',
            '{"event": "step", "step": 3, "loss": 9.9, "lr": 0.003}',
            '{"event": "start", "step": 2, "resumedFrom": "step-00000002.pt"}',
            '{"event": "step", "step": 3, "loss": 1.8, "lr": 0.003}',
            '{"event": "step", "step": 4, "loss": 1.7}',
            '{"event": "step", "step": 5, "lo',  # torn by a crash
        ]
    )
    rows = parse_run_log(text)
    assert len(rows) == 8
    c = curves(rows)
    assert c.loss == [(1, 2.3), (2, 2.0), (3, 1.8), (4, 1.7)]
    assert c.lr == [(1, 0.001), (2, 0.002), (3, 0.003)]
    assert not c.empty and curves([{"event": "start"}]).empty


def test_the_live_view_says_each_incident_once_when_it_closes() -> None:
    out: list[str] = []
    view = LiveView(out.append)
    lost = {"kind": "NodeLost", "detectedAt": "2026-11-26T10:05:10Z", "atStep": 40}
    view({"phase": "Restarting", "incidents": [lost]})  # open: nothing yet
    closed = {**lost, "resumedAt": "2026-11-26T10:05:41Z", "seconds": 31.0}
    closed |= {"resumedStep": 36, "stepsRedone": 5}
    view({"phase": "Running", "incidents": [closed]})
    view({"phase": "Running", "incidents": [closed]})
    said = [line.strip() for line in out if "incident" in line]
    assert said == [
        "incident NodeLost at step 40: training again after 31s (step 36, 5 steps redone)"
    ]
    # PerStep mode (its progress counts groups): the others trained on, nothing stopped.
    view = LiveView(out.append)
    group = {"kind": "Disruption", "detectedAt": "2026-11-28T01:25:53Z", "atStep": 180}
    group |= {"resumedAt": "2026-11-28T01:25:59Z", "seconds": 6, "resumedStep": 400}
    group |= {"stepsRedone": 0}
    view({"phase": "Running", "progress": {"groups": 2}, "incidents": [group]})
    view({"phase": "Running", "progress": {"groups": 1}, "incidents": [group, {**closed}]})
    assert [line.strip() for line in out if "incident" in line][1:] == [
        "incident Disruption at step 180: the other groups trained on (step 400 reported after"
        " 6s, 0 steps redone)",
        "incident NodeLost at step 40: training again after 31s (step 36, 5 steps redone)",
    ]
    # What each cost, as goodput counts it (the operator's lostSeconds), where it is known.
    view = LiveView(out.append)
    costs = [{**closed, "lostSeconds": 51.0}, {**group, "lostSeconds": 1.37}]
    view({"phase": "Running", "progress": {"groups": 3}, "incidents": costs})
    assert [line.strip() for line in out if "incident" in line][-2:] == [
        "incident NodeLost at step 40: training again after 31s (step 36, 5 steps redone, 51s"
        " lost)",
        "incident Disruption at step 180: the other groups trained on (step 400 reported after"
        " 6s, 0 steps redone, 1.4s lost)",
    ]
    # A lost lighthouse stalls every group until the new one answers; none restarts.
    view = LiveView(out.append)
    light = {**group, "kind": "LighthouseLost", "atStep": 410, "resumedStep": 560, "seconds": 10}
    view({"phase": "Running", "progress": {"groups": 3}, "incidents": [light]})
    assert [line.strip() for line in out if "incident" in line][-1] == (
        "incident LighthouseLost at step 410: the groups waited for a new lighthouse, none"
        " restarted (step 560 reported after 10s, 0 steps redone)"
    )
    # A group moved off a shared machine: it alone was away.
    view = LiveView(out.append)
    moved = {**group, "kind": "Rebalance", "atStep": 900, "resumedStep": 905, "seconds": 1}
    view({"phase": "Running", "progress": {"groups": 3}, "incidents": [moved]})
    assert [line.strip() for line in out if "incident" in line][-1] == (
        "incident Rebalance at step 900: a group moved to a machine of its own, the others"
        " trained on (step 905 reported after 1s, 0 steps redone)"
    )
