"""A node's log kept on the checkpoint volume (``ddp_trainer.launch.keptlog``,
``ddp_trainer.node``): relayed unchanged, each line timed as the kubelet times it, bounded and
rotated; a failing or slow volume never holds training up. Read back as the client does: its reader
pod's program run here on the kept files, its output merged in time order by the client's pure
parts."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from ddp_api.contract import ENV_LOG_FILE_MIB, ENV_LOG_FILES, kept_log_name, parse_kept_log_name
from ddp_client.kept_logs import node_logs, omitted_note, parse_dump
from ddp_client.log_dump import encoded
from ddp_client.loglines import merge_logs, parse_pod_log, parse_timestamp
from ddp_client.objects import InvalidJob, logs_reader_pod
from ddp_trainer.launch import keptlog, supervisor
from ddp_trainer.launch.keptlog import (
    KeptLog,
    KeptLogHandler,
    Relay,
    Settings,
    kept_line,
    must_rotate,
    rotation,
    settings_from,
    split_lines,
    stamp,
)


def test_each_line_is_timed_as_the_kubelet_times_it_and_the_client_reads_it_back() -> None:
    ns = 1_767_261_845_123_456_789  # 2026-01-01T10:04:05.123456789Z
    assert stamp(ns) == "2026-01-01T10:04:05.123456789Z"
    assert stamp(1_767_261_845_000_000_000) == "2026-01-01T10:04:05.000000000Z"
    assert parse_timestamp(stamp(ns)) == ns
    text = (kept_line(ns, b"[rank1]: step 3") + kept_line(ns + 1, b"agent: done")).decode()
    lines = parse_pod_log(text, "j-node-0", 0)
    assert [(line.at, line.rank, line.text) for line in lines] == [
        (ns, 1, "step 3"),
        (ns + 1, None, "agent: done"),
    ]


def test_lines_are_split_on_newlines_and_a_long_or_unended_line_is_cut() -> None:
    assert split_lines(b"", b"a\nb") == ([b"a"], b"b")
    assert split_lines(b"b", b"c\n\nd\n") == ([b"bc", b"", b"d"], b"")
    assert split_lines(b"", b"x" * 10 + b"\n", max_line=4) == ([b"xxxx", b"xxxx", b"xx"], b"")
    assert split_lines(b"xxx", b"xxxxxx", max_line=4) == ([b"xxxx", b"xxxx"], b"x")


def test_settings_have_the_kubelets_defaults_and_a_bad_value_is_said_once() -> None:
    assert settings_from({}) == (Settings(files=5, file_bytes=10 * 2**20), [])
    assert settings_from({ENV_LOG_FILES: "2", ENV_LOG_FILE_MIB: "0.5"})[0] == Settings(2, 2**19)
    assert not settings_from({ENV_LOG_FILES: "0"})[0].keeps
    settings, warnings = settings_from({ENV_LOG_FILES: "-1", ENV_LOG_FILE_MIB: "lots"})
    assert settings == Settings()
    assert warnings == [
        "DDPJOB_LOG_FILES='-1' is not an integer >= 0; 5",
        "DDPJOB_LOG_FILE_MIB='lots' is not a size in MiB > 0; 10",
    ]


def test_rotation_moves_each_file_up_one_and_drops_the_oldest() -> None:
    assert rotation("j-node-0", Settings(files=3)) == [
        ("j-node-0.log.1", "j-node-0.log.2"),
        ("j-node-0.log", "j-node-0.log.1"),
    ]
    assert rotation("j-node-0", Settings(files=1)) == []
    assert not must_rotate(0, 500, Settings(file_bytes=100))  # one write, however large
    assert not must_rotate(60, 40, Settings(file_bytes=100))
    assert must_rotate(60, 41, Settings(file_bytes=100))
    assert [parse_kept_log_name(kept_log_name("j-node-0", p)) for p in (0, 2)] == [
        ("j-node-0", 0),
        ("j-node-0", 2),
    ]
    assert parse_kept_log_name("j-node-0.log.tmp") is None
    assert parse_kept_log_name("j-node-0.log.0") is None


def test_the_log_is_kept_bounded_and_rotated_and_appended_to_by_the_next_attempt(
    tmp_path: Path,
) -> None:
    settings = Settings(files=3, file_bytes=200)
    kept = KeptLog(tmp_path, "j-node-0", settings)
    for i in range(40):
        kept.put(f"line {i:02d}".encode())
    kept.close()
    logs = tmp_path / "logs"
    assert sorted(p.name for p in logs.iterdir()) == [
        "j-node-0.log",
        "j-node-0.log.1",
        "j-node-0.log.2",
    ]
    assert all(p.stat().st_size <= 200 for p in logs.iterdir())
    # oldest first
    texts = [(logs / kept_log_name("j-node-0", part)).read_text() for part in (2, 1, 0)]
    lines = parse_pod_log("".join(texts), "j-node-0", 0)
    assert [line.text for line in lines][-1] == "line 39"
    numbers = [int(line.text.split()[1]) for line in lines]
    assert numbers == list(range(numbers[0], 40)) and numbers[0] > 0  # the oldest were dropped
    assert [line.at for line in lines] == sorted(line.at for line in lines)

    again = KeptLog(tmp_path, "j-node-0", settings)  # the pod recreated under its name
    again.put(b"second attempt")
    again.close()
    texts = [(logs / kept_log_name("j-node-0", part)).read_text() for part in (2, 1, 0)]
    lines = parse_pod_log("".join(texts), "j-node-0", 0)
    assert [line.text for line in lines][-2:] == ["line 39", "second attempt"]


def test_a_volume_that_fails_is_said_once_and_keeps_nothing_more(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "logs").write_text("not a folder")
    kept = KeptLog(tmp_path, "j-node-0", Settings())
    kept.put(b"one")
    kept.close()
    kept.put(b"two")  # after the failure: dropped at once
    assert kept.failed
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("cannot keep this pod's log in ")


def test_a_slow_volume_drops_lines_instead_of_holding_training_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keptlog, "QUEUE_LINES", 3)
    kept = KeptLog(tmp_path, "j-node-0", Settings())
    stuck = threading.Event()
    write = kept._write
    monkeypatch.setattr(kept, "_write", lambda line: stuck.wait(10) and write(line))
    for i in range(20):
        kept.put(f"line {i}".encode())  # returns at once though the writer is stuck
    assert kept.dropped >= 20 - 3 - 1
    stuck.set()
    kept.close()
    text = (tmp_path / "logs" / "j-node-0.log").read_text()
    assert "lines of this pod's log were not kept here" in text


def test_a_relay_passes_bytes_through_unchanged_and_keeps_each_line(tmp_path: Path) -> None:
    kept = KeptLog(tmp_path, "j-node-0", Settings())
    child_r, child_w = os.pipe()
    out_r, out_w = os.pipe()
    relay = Relay(child_r, out_w, kept)
    written = b"[rank0]: step 1\n[rank0]: 50%\r[rank0]: 100%\nno newline at the end"
    os.write(child_w, written[:20])
    os.write(child_w, written[20:])
    os.close(child_w)
    relay.join(5)
    os.close(out_w)
    with os.fdopen(out_r, "rb") as out:
        assert out.read() == written
    kept.close()
    text = (tmp_path / "logs" / "j-node-0.log").read_bytes().decode()
    assert "50%\r[rank0]: 100%\n" in text  # one line to the kubelet: it splits on \n only
    lines = parse_pod_log(text, "j-node-0", 0)
    assert [(line.rank, line.text) for line in lines] == [
        (0, "step 1"),
        (0, "50%"),
        (0, "100%"),
        (None, "no newline at the end"),
    ]


def test_the_wrapper_keeps_torchruns_output_and_its_own_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    def fake_torchrun(args: list[str], barrier_s: float, warm_workers: bool) -> None:
        os.write(1, b"[rank0]: to stdout\n")
        os.write(2, b"agent: to stderr\n")
        os._exit(3)

    monkeypatch.setattr(supervisor, "run_torchrun", fake_torchrun)
    kept = KeptLog(tmp_path, "j-node-1", Settings())
    handler = KeptLogHandler(kept, logging.Formatter("%(levelname)s %(message)s"))
    logging.getLogger("ddp_trainer.node").addHandler(handler)
    try:
        supervisor.log.warning("the wrapper says\nin two lines")
        sys.stdout.flush()
        assert supervisor.Torchrun(["x"], 1.0, kept).wait() == 3
    finally:
        logging.getLogger("ddp_trainer.node").removeHandler(handler)
    kept.close()
    out, err = capfd.readouterr()
    assert out == "[rank0]: to stdout\n" and err.endswith("agent: to stderr\n")
    text = (tmp_path / "logs" / "j-node-1.log").read_text()
    lines = [line.text for line in parse_pod_log(text, "j-node-1", 1)]
    assert lines[:2] == ["WARNING the wrapper says", "in two lines"]
    assert sorted(lines[2:]) == ["agent: to stderr", "to stdout"]


# -- read back: the reader pod's program, what the client makes of its output --------------------
def keep_lines(folder: Path, pod: str, settings: Settings, *texts: str) -> None:
    kept = KeptLog(folder, pod, settings)
    for text in texts:
        kept.put(text.encode())
    kept.close()


def run_reader_pod(folder: Path, budget: int) -> str:
    """The reader pod's command, as logs_reader_pod renders it, run here."""
    pod = logs_reader_pod(JOB, "trainer:1", budget)
    command = pod["spec"]["containers"][0]["command"]
    assert command[0] == "python" and command[3:] == ["/ckpt/logs", "j-node-", str(budget)]
    out = subprocess.run(
        [sys.executable, *command[1:3], str(folder / "logs"), *command[4:]],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return out.stdout


JOB: dict[str, Any] = {
    "metadata": {"name": "j", "namespace": "team", "uid": "uid-1"},
    "spec": {
        "checkpoint": {"volume": {"persistentVolumeClaim": {"claimName": "ck"}}, "path": "/ckpt"}
    },
}


def test_the_logs_reader_pod_runs_pythons_reader_on_the_volume_read_only_and_restricted() -> None:
    pod = logs_reader_pod(JOB, "trainer:1", 1000)
    (c,) = pod["spec"]["containers"]
    assert pod["metadata"]["generateName"] == "j-logs-" and c["name"] == "logs"
    assert c["volumeMounts"] == [{"name": "checkpoints", "mountPath": "/ckpt", "readOnly": True}]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["automountServiceAccountToken"] is False
    with pytest.raises(InvalidJob, match=r"ddpjob j has no checkpoint volume .* no logs to read"):
        logs_reader_pod({**JOB, "spec": {}}, "i", 1000)


def test_every_nodes_kept_files_come_back_merged_in_time_order_oldest_part_first(
    tmp_path: Path,
) -> None:
    small = Settings(files=3, file_bytes=120)
    keep_lines(tmp_path, "j-node-0", small, *(f"[rank0]: a{i}" for i in range(6)))
    keep_lines(tmp_path, "j-node-1", small, "[rank1]: b0", "agent: b1")
    keep_lines(tmp_path, "other-node-0", small, "another job's line")
    dump = parse_dump(run_reader_pod(tmp_path, 10**6))
    assert sorted(dump.files) == [
        "j-node-0.log",
        "j-node-0.log.1",
        "j-node-0.log.2",
        "j-node-1.log",
    ]
    assert not dump.omitted
    logs = node_logs(dump.files, "j")
    assert [[line.text for line in log] for log in logs] == [
        [f"a{i}" for i in range(6)][-len(logs[0]) :],
        ["b0", "agent: b1"],
    ]
    assert [line.show() for line in merge_logs(logs)][-2:] == [
        "[node-1 rank1] b0",
        "[node-1] agent: b1",
    ]
    assert node_logs(dump.files, "j", since_ns=logs[1][0].at) == [[], logs[1]]


def test_what_does_not_fit_the_reader_pods_log_is_left_out_oldest_first_and_said(
    tmp_path: Path,
) -> None:
    small = Settings(files=3, file_bytes=2000)
    keep_lines(
        tmp_path, "j-node-0", small, *(f"[rank0]: {os.urandom(40).hex()}" for _ in range(90))
    )
    keep_lines(tmp_path, "j-node-1", small, "[rank1]: one line")
    whole = parse_dump(run_reader_pod(tmp_path, 10**6))
    assert len(whole.files) == 4
    first_two = sum(
        len(encoded(whole.files[n])) for n in ("j-node-0.log", "j-node-1.log")
    )  # each node's newest part fits; node 0's older parts do not
    dump = parse_dump(run_reader_pod(tmp_path, first_two + 10))
    assert sorted(dump.files) == ["j-node-0.log", "j-node-1.log"]
    assert sorted(dump.omitted) == ["j-node-0.log.1", "j-node-0.log.2"]
    note = omitted_note(dump.omitted, "j")
    assert note is not None and note.startswith("2 older kept files of node-0 (")


def test_a_reader_output_cut_short_loses_only_the_file_it_cut() -> None:
    whole = f"ddp-kept-log j-node-0.log\n{encoded(b'x').decode()}ddp-kept-log-end\n"
    cut = f"ddp-kept-log j-node-1.log\n{encoded(b'y' * 100).decode()[:10]}\nddp-kept-log-end\n"
    dump = parse_dump(whole + cut)
    assert dump.files == {"j-node-0.log": b"x"} and dump.omitted == {"j-node-1.log": 0}
