"""Container logs of the test kubelet with the time of every line, and the pure half of
serving them as a kubelet's ``/containerLogs`` does (logserver.py is the HTTP half).

Run ``n`` of a container writes ``<n>.log``, exactly what it printed (stdout and stderr in
one stream), and beside it ``<n>.log.times``: one line ``<end offset> <Unix time in ns>`` per
record of the log, appended after the record itself. A record is a line up to and including
its newline, or 16 KiB of a longer line (like the CRI log format's partial entries); its
time is when podexec read its last byte from the container's pipe, never earlier than the
record before it.
"""

from __future__ import annotations

import calendar
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_RECORD = 16 * 1024
TIMES_SUFFIX = ".times"


def times_path(log: Path) -> Path:
    return log.with_name(log.name + TIMES_SUFFIX)


# -- writing (podexec) --------------------------------------------------------------------
def record_ends(pending: int, chunk: bytes, limit: int = MAX_RECORD) -> tuple[list[int], int]:
    """Where records end in ``chunk`` (offsets into it, exclusive) when ``pending`` bytes of
    an unfinished record precede it, and how many bytes the last unfinished record holds."""
    ends: list[int] = []
    i = 0
    while i < len(chunk):
        room = limit - pending
        newline = chunk.find(b"\n", i, i + room)
        if newline >= 0:
            i = newline + 1
        elif len(chunk) - i >= room:
            i += room
        else:
            return ends, pending + len(chunk) - i
        ends.append(i)
        pending = 0
    return ends, pending


class LogWriter:
    """Appends a container's output to its log file and each record's time to the times file
    (both file descriptors opened for appending)."""

    def __init__(self, log_fd: int, times_fd: int) -> None:
        self.log_fd, self.times_fd = log_fd, times_fd
        self.offset = os.lseek(log_fd, 0, os.SEEK_END)
        self.pending = 0
        self.last_ns = 0

    def write(self, chunk: bytes, now_ns: int) -> None:
        _write_all(self.log_fd, chunk)
        ends, self.pending = record_ends(self.pending, chunk)
        if ends:
            self._times([self.offset + e for e in ends], now_ns)
        self.offset += len(chunk)

    def finish(self, now_ns: int) -> None:
        """Ends an unfinished last line (the container exited without a newline)."""
        if self.pending:
            self._times([self.offset], now_ns)
            self.pending = 0

    def _times(self, ends: list[int], now_ns: int) -> None:
        self.last_ns = max(self.last_ns, now_ns)
        _write_all(self.times_fd, b"".join(f"{e} {self.last_ns}\n".encode() for e in ends))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# -- reading --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Record:
    start: int  # byte offsets into the log file
    end: int
    ns: int  # Unix time in nanoseconds


def parse_times(data: bytes, prev_end: int) -> tuple[list[Record], int]:
    """The records of times-file text whose first record starts at ``prev_end``, and how many
    bytes of ``data`` they used (a torn last line waits for the next read)."""
    records = []
    used = 0
    while (newline := data.find(b"\n", used)) >= 0:
        end_s, ns_s = data[used:newline].split()
        end = int(end_s)
        records.append(Record(prev_end, end, int(ns_s)))
        prev_end, used = end, newline + 1
    return records, used


def untimed(data: bytes, start: int, ns: int) -> list[Record]:
    """Records for log bytes that have no times (written by a podexec that was killed before
    it could note them), all at time ``ns``."""
    ends, pending = record_ends(0, data)
    if pending:
        ends.append(len(data))
    return [Record(start + a, start + b, ns) for a, b in zip([0, *ends], ends, strict=False)]


class LogReader:
    """Reads one run's log record by record, picking up what was appended since last time."""

    def __init__(self, log: Path) -> None:
        self.fd = os.open(log, os.O_RDONLY)
        self.times = times_path(log)
        self.times_used = 0
        self.end = 0  # where the records read so far end

    def close(self) -> None:
        os.close(self.fd)

    def new_records(self) -> list[Record]:
        try:
            with self.times.open("rb") as f:
                f.seek(self.times_used)
                data = f.read()
        except FileNotFoundError:
            return []
        records, used = parse_times(data, self.end)
        self.times_used += used
        if records:
            self.end = records[-1].end
        return records

    def rest(self) -> list[Record]:
        """The bytes after the last timed record, for a run that has ended."""
        st = os.fstat(self.fd)
        if st.st_size <= self.end:
            return []
        records = untimed(
            os.pread(self.fd, st.st_size - self.end, self.end), self.end, st.st_mtime_ns
        )
        self.end = records[-1].end
        return records

    def read(self, record: Record) -> bytes:
        return os.pread(self.fd, record.end - record.start, record.start)


# -- time stamps ------------------------------------------------------------------------------
def format_time(ns: int) -> str:
    """RFC 3339 with nine fraction digits in UTC, as a kubelet prefixes log lines."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{fraction:09d}Z"


_RFC3339 = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)[Tt](\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(?:([Zz])|([+-])(\d\d):(\d\d))"
)


def parse_time(text: str) -> int:
    """Unix nanoseconds of an RFC 3339 time (fraction optional, any offset)."""
    m = _RFC3339.fullmatch(text)
    if m is None:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    if m[9]:
        offset = (int(m[10]) * 60 + int(m[11])) * 60
        seconds -= offset if m[9] == "+" else -offset
    return seconds * 1_000_000_000 + int((m[7] or "").ljust(9, "0"))


# -- the request --------------------------------------------------------------------------
class LogRequestError(Exception):
    """A request the kubelet refuses: its HTTP status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


INVALID = LogRequestError(422, '{"message": "Invalid request."}')


@dataclass(frozen=True)
class LogQuery:
    """The query of ``GET /containerLogs/...`` (PodLogOptions, as the API server forwards it)."""

    follow: bool = False
    previous: bool = False
    timestamps: bool = False
    tail_lines: int | None = None
    limit_bytes: int | None = None
    since_seconds: int | None = None
    since_time_ns: int | None = None

    def since_ns(self, now_ns: int) -> int | None:
        if self.since_seconds is not None:
            return now_ns - self.since_seconds * 1_000_000_000
        return self.since_time_ns


def _flag(values: Sequence[str]) -> bool:
    # as the API machinery converts query booleans: only "0" and "false" are false
    return bool(values) and values[0] != "0" and values[0].lower() != "false"


def parse_query(params: Mapping[str, Sequence[str]]) -> LogQuery:
    """PodLogOptions from query parameters (``urllib.parse.parse_qs`` with blank values), or
    LogRequestError: 400 for what does not parse, 422 for what a kubelet finds invalid."""
    params = dict(params)
    if "tail" in params:  # the old name of tailLines; "all" means no limit
        tail = params.pop("tail")
        if tail and tail[0] != "all":
            params["tailLines"] = tail
    try:
        ints = {
            k: int(params[k][0]) if params.get(k) else None
            for k in ("tailLines", "limitBytes", "sinceSeconds")
        }
        since_time = parse_time(params["sinceTime"][0]) if params.get("sinceTime") else None
    except ValueError:
        raise LogRequestError(400, '{"message": "Unable to decode query."}') from None
    stream = (params.get("stream") or ["All"])[0]
    if stream != "All":
        raise LogRequestError(400, f"unable to return the given log stream: {stream!r}")
    query = LogQuery(
        follow=_flag(params.get("follow", [])),
        previous=_flag(params.get("previous", [])),
        timestamps=_flag(params.get("timestamps", [])),
        tail_lines=ints["tailLines"],
        limit_bytes=ints["limitBytes"],
        since_seconds=ints["sinceSeconds"],
        since_time_ns=since_time,
    )
    if query.tail_lines is not None and query.tail_lines < 0:
        raise INVALID
    if query.limit_bytes is not None and query.limit_bytes < 1:
        raise INVALID
    if query.since_seconds is not None and (query.since_seconds < 1 or since_time is not None):
        raise INVALID
    return query


def tail(records: list[Record], lines: int | None) -> list[Record]:
    """The last ``lines`` records (all when None)."""
    if lines is None:
        return records
    return records[len(records) - lines :] if lines else []


@dataclass
class Renderer:
    """Turns records into response bytes: the time stamp before each line's first record,
    ``since`` filtering and the byte limit (which counts the time stamps, as a kubelet's)."""

    timestamps: bool = False
    since_ns: int | None = None
    remaining: int | None = None  # bytes still allowed; None: no limit
    line_start: bool = field(default=True, init=False)

    @property
    def done(self) -> bool:
        return self.remaining is not None and self.remaining <= 0

    def render(self, record: Record, data: bytes) -> bytes:
        starts_line = self.line_start
        self.line_start = not data or data.endswith(b"\n")
        if self.done or (self.since_ns is not None and record.ns < self.since_ns):
            return b""
        if self.timestamps and starts_line:
            data = format_time(record.ns).encode() + b" " + data
        if self.remaining is not None:
            data = data[: self.remaining]
            self.remaining -= len(data)
        return data


# -- which log ----------------------------------------------------------------------------
def container_names(pod: Mapping[str, Any]) -> list[str]:
    spec = pod.get("spec") or {}
    kinds = ("initContainers", "containers", "ephemeralContainers")
    return [c["name"] for k in kinds for c in spec.get(k) or []]


def container_state(pod: Mapping[str, Any], container: str) -> dict[str, Any]:
    """The container's ``state`` in the pod's status (``{}`` before it has one)."""
    status = pod.get("status") or {}
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        for cs in status.get(key) or []:
            if cs.get("name") == container:
                return dict(cs.get("state") or {})
    return {}


def run_numbers(names: list[str]) -> list[int]:
    """The runs of a container, oldest first, from the file names in its log folder."""
    return sorted(int(n[: -len(".log")]) for n in names if re.fullmatch(r"\d+\.log", n))


def pick_run(runs: list[int], previous: bool, container: str, pod: Mapping[str, Any]) -> int:
    """The run to serve, as a kubelet picks it: the latest; with ``previous`` the last one
    that ended before it, which is the latest itself while the container waits to restart.
    Otherwise the error a kubelet gives."""
    name = pod["metadata"]["name"]
    waiting = container_state(pod, container).get("waiting")
    if previous:
        if waiting is not None and runs:
            return runs[-1]
        if len(runs) < 2:
            raise LogRequestError(
                400, f'previous terminated container "{container}" in pod "{name}" not found'
            )
        return runs[-2]
    if not runs:
        reason = (waiting or {}).get("reason") or "ContainerCreating"
        raise LogRequestError(
            400, f'container "{container}" in pod "{name}" is waiting to start: {reason}'
        )
    return runs[-1]
