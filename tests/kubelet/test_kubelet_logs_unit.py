"""The test kubelet's container logs without a cluster: records and their times, the query a
kubelet takes, and which lines, stamps and bytes an answer holds."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import pytest

from ddp_devcluster import podlogs
from ddp_devcluster.podlogs import LogQuery, LogRequestError, Record, Renderer

T0 = 1_700_000_000_123_456_789  # 2023-11-14T22:13:20.123456789Z


# -- records --------------------------------------------------------------------------------
def test_records_end_at_newlines_and_carry_unfinished_lines() -> None:
    assert podlogs.record_ends(0, b"a\nbc\n") == ([2, 5], 0)
    assert podlogs.record_ends(0, b"a\nbc") == ([2], 2)
    assert podlogs.record_ends(2, b"d\n") == ([2], 0)
    assert podlogs.record_ends(0, b"") == ([], 0)


def test_long_lines_are_cut_into_records_of_the_limit() -> None:
    assert podlogs.record_ends(0, b"x" * 10, limit=4) == ([4, 8], 2)
    assert podlogs.record_ends(3, b"xx\n", limit=4) == ([1, 3], 0)
    assert podlogs.record_ends(0, b"xxx\n", limit=4) == ([4], 0)


def test_times_parse_in_order_and_wait_for_a_torn_line() -> None:
    records, used = podlogs.parse_times(b"4 10\n9 12\n15 1", prev_end=0)
    assert records == [Record(0, 4, 10), Record(4, 9, 12)]
    assert used == len(b"4 10\n9 12\n")
    assert podlogs.parse_times(b"15 13\n", prev_end=9) == ([Record(9, 15, 13)], 6)


def test_untimed_bytes_become_records_at_one_time() -> None:
    assert podlogs.untimed(b"a\nbc", start=10, ns=7) == [Record(10, 12, 7), Record(12, 14, 7)]
    assert podlogs.untimed(b"a\n", start=0, ns=7) == [Record(0, 2, 7)]


def test_writer_and_reader_round_trip(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    log.write_bytes(b"")
    log_fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    times_fd = os.open(podlogs.times_path(log), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    writer = podlogs.LogWriter(log_fd, times_fd)
    reader = podlogs.LogReader(log)
    try:
        writer.write(b"one\ntw", T0 + 5)
        assert [reader.read(r) for r in reader.new_records()] == [b"one\n"]
        writer.write(b"o\n", T0)  # the clock went back: times never do
        writer.write(b"three", T0 + 9)
        [two] = reader.new_records()
        assert (reader.read(two), two.ns) == (b"two\n", T0 + 5)
        assert reader.new_records() == []
        writer.finish(T0 + 10)
        [three] = reader.new_records()
        assert (reader.read(three), three.ns) == (b"three", T0 + 10)
        assert reader.rest() == []
        os.write(log_fd, b"killed before its time\n")  # podexec died: no times for this
        [rest] = reader.rest()
        assert reader.read(rest) == b"killed before its time\n"
        assert log.read_bytes() == b"one\ntwo\nthreekilled before its time\n"
    finally:
        reader.close()
        os.close(log_fd)
        os.close(times_fd)


# -- times ----------------------------------------------------------------------------------
def test_time_stamps_are_rfc3339_with_nine_digits_in_utc() -> None:
    assert podlogs.format_time(T0) == "2023-11-14T22:13:20.123456789Z"
    assert podlogs.format_time(1_700_000_000_000_000_000) == "2023-11-14T22:13:20.000000000Z"
    parsed = dt.datetime.fromisoformat(podlogs.format_time(T0))
    assert parsed.timestamp() == pytest.approx(T0 / 1e9)


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("2023-11-14T22:13:20.123456789Z", T0),
        ("2023-11-14T22:13:20Z", 1_700_000_000_000_000_000),
        ("2023-11-14T22:13:20.5Z", 1_700_000_000_500_000_000),
        ("2023-11-15T00:13:20+02:00", 1_700_000_000_000_000_000),
        ("2023-11-14T21:13:20-01:00", 1_700_000_000_000_000_000),
    ],
)
def test_rfc3339_times_parse_to_nanoseconds(text: str, ns: int) -> None:
    assert podlogs.parse_time(text) == ns


def test_times_that_are_not_rfc3339_are_refused() -> None:
    for text in ("2023-11-14", "2023-11-14T22:13:20", "yesterday", "2023-11-14T22:13:20.Z"):
        with pytest.raises(ValueError, match="RFC 3339"):
            podlogs.parse_time(text)


# -- the query ------------------------------------------------------------------------------
def test_query_as_the_api_server_forwards_it() -> None:
    q = podlogs.parse_query(
        {
            "follow": ["true"],
            "previous": ["true"],
            "timestamps": ["true"],
            "tailLines": ["3"],
            "limitBytes": ["100"],
            "sinceTime": ["2023-11-14T22:13:20Z"],
        }
    )
    assert q == LogQuery(True, True, True, 3, 100, None, 1_700_000_000_000_000_000)
    assert q.since_ns(now_ns=T0) == 1_700_000_000_000_000_000
    assert podlogs.parse_query({}) == LogQuery()
    assert podlogs.parse_query({"sinceSeconds": ["2"]}).since_ns(now_ns=T0) == T0 - 2 * 10**9


def test_query_booleans_and_the_old_tail_name() -> None:
    assert podlogs.parse_query({"follow": ["false"], "timestamps": ["0"]}) == LogQuery()
    assert podlogs.parse_query({"follow": ["1"], "timestamps": ["True"]}) == LogQuery(
        follow=True, timestamps=True
    )
    assert podlogs.parse_query({"tail": ["5"]}).tail_lines == 5
    assert podlogs.parse_query({"tail": ["all"]}).tail_lines is None


@pytest.mark.parametrize(
    ("params", "status"),
    [
        ({"tailLines": ["x"]}, 400),
        ({"sinceTime": ["yesterday"]}, 400),
        ({"stream": ["Stderr"]}, 400),
        ({"tailLines": ["-1"]}, 422),
        ({"limitBytes": ["0"]}, 422),
        ({"sinceSeconds": ["0"]}, 422),
        ({"sinceSeconds": ["5"], "sinceTime": ["2023-11-14T22:13:20Z"]}, 422),
    ],
)
def test_bad_queries_are_refused_as_a_kubelet_does(params: Any, status: int) -> None:
    with pytest.raises(LogRequestError) as e:
        podlogs.parse_query(params)
    assert e.value.status == status


# -- which lines, stamps and bytes ----------------------------------------------------------
RECORDS = [Record(0, 2, 1), Record(2, 4, 2), Record(4, 6, 3)]


def test_tail_takes_the_last_records() -> None:
    assert podlogs.tail(RECORDS, None) == RECORDS
    assert podlogs.tail(RECORDS, 1) == RECORDS[2:]
    assert podlogs.tail(RECORDS, 0) == []
    assert podlogs.tail(RECORDS, 10) == RECORDS


def test_time_stamps_prefix_lines_not_the_rest_of_a_long_line() -> None:
    out = Renderer(timestamps=True)
    stamp = podlogs.format_time(T0).encode()
    assert out.render(Record(0, 4, T0), b"abc\n") == stamp + b" abc\n"
    assert out.render(Record(4, 8, T0), b"long") == stamp + b" long"
    assert out.render(Record(8, 12, T0 + 1), b"ish\n") == b"ish\n"
    assert Renderer().render(Record(0, 4, T0), b"abc\n") == b"abc\n"


def test_since_drops_older_records() -> None:
    out = Renderer(since_ns=2)
    assert [out.render(r, b"x\n") for r in RECORDS] == [b"", b"x\n", b"x\n"]


def test_the_byte_limit_counts_stamps_and_cuts_the_last_line() -> None:
    out = Renderer(timestamps=True, remaining=len(podlogs.format_time(T0)) + 4)
    assert out.render(Record(0, 4, T0), b"abc\n") == podlogs.format_time(T0).encode() + b" abc"
    assert out.done
    assert out.render(Record(4, 8, T0), b"def\n") == b""
    assert not Renderer().done


# -- which run ------------------------------------------------------------------------------
def _pod(state: dict[str, Any] | None = None) -> dict[str, Any]:
    statuses = [{"name": "main", "state": state}] if state is not None else []
    return {
        "metadata": {"name": "p"},
        "spec": {"initContainers": [{"name": "init"}], "containers": [{"name": "main"}]},
        "status": {"containerStatuses": statuses},
    }


def test_container_names_and_runs() -> None:
    assert podlogs.container_names(_pod()) == ["init", "main"]
    names = ["10.log", "2.log", "2.log.times", "x.log", "kubelet.log"]
    assert podlogs.run_numbers(names) == [2, 10]


def test_the_latest_run_and_the_previous_one() -> None:
    running = _pod({"running": {}})
    assert podlogs.pick_run([0, 1, 2], False, "main", running) == 2
    assert podlogs.pick_run([0, 1, 2], True, "main", running) == 1
    # waiting to restart: the last run is both the current log and the previous one
    waiting = _pod({"waiting": {"reason": "CrashLoopBackOff"}})
    assert podlogs.pick_run([0, 1], False, "main", waiting) == 1
    assert podlogs.pick_run([0, 1], True, "main", waiting) == 1


def test_runs_that_do_not_exist_are_named_in_the_error() -> None:
    with pytest.raises(LogRequestError, match='previous terminated container "main" in pod "p"'):
        podlogs.pick_run([0], True, "main", _pod({"terminated": {}}))
    with pytest.raises(LogRequestError, match="is waiting to start: CreateContainerConfigError"):
        podlogs.pick_run(
            [], False, "main", _pod({"waiting": {"reason": "CreateContainerConfigError"}})
        )
    with pytest.raises(LogRequestError, match="is waiting to start: ContainerCreating") as e:
        podlogs.pick_run([], False, "main", _pod())
    assert e.value.status == 400
