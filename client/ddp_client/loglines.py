"""A job's pods' logs as lines that know their node and global rank, without I/O: parsed
from what the API returns (with timestamps), merged in time order, and merged live while
streams still arrive (``kubectl ddp logs [-f]``)."""

from __future__ import annotations

import datetime as dt
import heapq
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from ddp_api.pods import LOG_LINE_PREFIX_TEMPLATE

# torchrun's prefix of a worker's line (the operator renders the template), e.g. "[rank3]: ".
_TEE_PREFIX = re.compile(
    "^" + re.escape(LOG_LINE_PREFIX_TEMPLATE).replace(re.escape("${rank}"), r"(\d+)")
)
# The bundled trainer's own format (ddp_trainer.__main__), for pods run without the prefix:
# "2025-01-02 03:04:05,678 rank1 WARNING ...".
_TRAINER_FORMAT = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ rank(\d+) ")
_FRACTION = re.compile(r"\.(\d+)")


def parse_timestamp(text: str) -> int | None:
    """Nanoseconds since the epoch of an RFC 3339 timestamp as the kubelet writes them
    (``2025-01-02T03:04:05.123456789Z``, nine digits at most, trailing zeros dropped); None
    when ``text`` is not one."""
    fraction = _FRACTION.search(text)
    nanos = 0
    if fraction:
        digits = fraction.group(1)
        if len(digits) > 9:
            return None
        nanos = int(digits.ljust(9, "0"))
        text = text[: fraction.start()] + text[fraction.end() :]
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    return int(when.timestamp()) * 1_000_000_000 + nanos


def rank_of(text: str) -> tuple[int | None, str]:
    """The global rank that wrote a line, and the line without torchrun's prefix; None for a
    line of no worker (torchrun's agent, the pod's wrapper)."""
    tee = _TEE_PREFIX.match(text)
    if tee:
        return int(tee.group(1)), text[tee.end() :]
    trainer = _TRAINER_FORMAT.match(text)
    if trainer:
        return int(trainer.group(1)), text
    return None, text


@dataclass(frozen=True)
class LogLine:
    """One line of a pod's log: when the kubelet read it, where it came from, what it says."""

    at: int  # nanoseconds since the epoch
    pod: str
    node: int | None  # the pod's node index
    rank: int | None  # the global rank that wrote it; None for torchrun's agent
    text: str
    time: str = ""  # the kubelet's timestamp as written

    @property
    def source(self) -> str:
        where = f"node-{self.node}" if self.node is not None else self.pod
        return where if self.rank is None else f"{where} rank{self.rank}"

    def show(self, timestamps: bool = False) -> str:
        """``[node-0 rank1] text``, optionally after the kubelet's timestamp."""
        line = f"[{self.source}] {self.text}"
        return f"{self.time} {line}" if timestamps else line


def parse_pod_log(text: str, pod: str, node: int | None) -> list[LogLine]:
    """The lines of ``pods/log?timestamps=true``. A line without a timestamp (none should
    have one missing) keeps the time of the line before it."""
    lines: list[LogLine] = []
    for raw in text.splitlines():
        lines.append(parse_line(raw, pod, node, lines[-1] if lines else None))
    return lines


def parse_line(raw: str, pod: str, node: int | None, before: LogLine | None = None) -> LogLine:
    """One line of ``pods/log?timestamps=true``: ``<RFC 3339 time> <text>``."""
    stamp, _, rest = raw.partition(" ")
    at = parse_timestamp(stamp)
    if at is None:
        stamp, rest, at = (before.time, raw, before.at) if before else ("", raw, 0)
    rank, text = rank_of(rest)
    return LogLine(at=at, pod=pod, node=node, rank=rank, text=text, time=stamp)


def merge_logs(logs: Iterable[list[LogLine]]) -> list[LogLine]:
    """The lines of several pods in time order; lines of one pod keep their order, and lines
    of the same instant keep the order of ``logs``."""
    return list(heapq.merge(*logs, key=lambda line: line.at))


def pick_rank(lines: Iterable[LogLine], rank: int | None) -> list[LogLine]:
    """The lines written by global rank ``rank`` (all lines when None)."""
    return [line for line in lines if rank is None or line.rank == rank]


@dataclass
class LiveMerge:
    """Lines of several live streams in time order. A line waits ``hold_s`` after it arrived,
    so that a line of another pod with an earlier timestamp that arrives a little later still
    comes first; a line later than that is shown when it comes, out of order."""

    hold_s: float = 1.0
    _heap: list[tuple[int, int, LogLine]] = field(default_factory=list)
    _arrivals: deque[tuple[float, int]] = field(default_factory=deque)
    _seq: int = 0
    _watermark: int | None = None  # lines up to this time may go out

    def add(self, line: LogLine, received: float) -> None:
        heapq.heappush(self._heap, (line.at, self._seq, line))
        self._arrivals.append((received, line.at))
        self._seq += 1

    def ready(self, now: float) -> list[LogLine]:
        """The lines that have waited long enough, and every line older than them."""
        while self._arrivals and self._arrivals[0][0] <= now - self.hold_s:
            _, at = self._arrivals.popleft()
            self._watermark = at if self._watermark is None else max(self._watermark, at)
        out = []
        while self._heap and self._watermark is not None and self._heap[0][0] <= self._watermark:
            out.append(heapq.heappop(self._heap)[2])
        return out

    def flush(self) -> list[LogLine]:
        """Every line still waiting, in time order."""
        self._arrivals.clear()
        out = [heapq.heappop(self._heap)[2] for _ in range(len(self._heap))]
        return out
