"""A job's merged logs, whole or followed while its pods run (``kubectl ddp logs [-f]``)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from ddp_api.ddpjob import TERMINAL_PHASES
from ddp_api.pods import CONTAINER, selector

from .connection import REQUEST_TIMEOUT
from .errors import ClusterUnreachable, DDPError
from .jobs import Jobs
from .loglines import LiveMerge, LogLine, merge_logs, parse_line, parse_pod_log, pick_rank
from .pod_state import node_index, started, terminated

POD_LIST_INTERVAL_S = 2.0  # how often `logs -f` looks for new pods
FOLLOW_HOLD_S = 1.0  # how long `logs -f` holds a line for earlier ones of other pods


class Logs(Jobs):
    """The logs of a job's node pods, each line knowing its node and global rank."""

    def _workers(self, name: str) -> list[dict[str, Any]]:
        """The job's node pods, by node index."""
        with self._calls():
            pods = self._core.list_namespaced_pod(
                self.namespace, label_selector=selector(name), _request_timeout=REQUEST_TIMEOUT
            )
        items = self._api.sanitize_for_serialization(pods).get("items") or []
        return sorted(items, key=lambda p: (node_index(p) is None, node_index(p) or 0))

    def _pod_log(self, pod: Mapping[str, Any], container: str, timestamps: bool) -> str:
        """A container's whole log; "" when it has not started yet."""
        meta = pod["metadata"]
        try:
            with self._calls():
                return str(
                    self._core.read_namespaced_pod_log(
                        meta["name"],
                        meta.get("namespace", self.namespace),
                        container=container,
                        timestamps=timestamps,
                        _request_timeout=REQUEST_TIMEOUT,
                    )
                )
        except ClusterUnreachable:
            raise
        except DDPError as error:
            if not started(pod, container):
                return ""
            raise DDPError(f"cannot read the log of pod {meta['name']}: {error}") from None

    def logs(
        self, name: str, *, follow: bool = False, rank: int | None = None
    ) -> Iterator[LogLine]:
        """The lines of every node's log in time order, each knowing its node and global rank
        (:meth:`LogLine.show` prints ``[node-0 rank1] text``); only rank ``rank``'s when given.
        ``follow`` streams until the job has finished and its pods' logs have ended."""
        self.get(name)  # JobNotFound before anything else
        if follow:
            yield from self._follow(name, rank)
            return
        logs = [
            parse_pod_log(self._pod_log(p, CONTAINER, True), p["metadata"]["name"], node_index(p))
            for p in self._workers(name)
        ]
        yield from pick_rank(merge_logs(logs), rank)

    def _follow(self, name: str, rank: int | None) -> Iterator[LogLine]:
        lines: queue.Queue[LogLine | None] = queue.Queue()
        merge = LiveMerge(FOLLOW_HOLD_S)
        streams: dict[str, _Stream] = {}  # by pod uid: a recreated pod is a new stream
        next_list = 0.0
        finished = False
        try:
            while True:
                now = time.monotonic()
                if now >= next_list:
                    next_list = now + POD_LIST_INTERVAL_S
                    finished = self.status(name).phase in TERMINAL_PHASES
                    for pod in self._workers(name):
                        uid = pod["metadata"]["uid"]
                        stream = streams.get(uid)
                        if started(pod, CONTAINER) and (stream is None or stream.resumable(pod)):
                            streams[uid] = _Stream(self, pod, lines, after=stream)
                refused = next((s.error for s in streams.values() if s.error), None)
                if refused:
                    raise DDPError(refused)
                try:
                    line = lines.get(timeout=0.2)
                    if line is not None:
                        merge.add(line, time.monotonic())
                except queue.Empty:
                    pass
                yield from pick_rank(merge.ready(time.monotonic()), rank)
                if finished and all(s.done.is_set() for s in streams.values()) and lines.empty():
                    yield from pick_rank(merge.flush(), rank)
                    return
        finally:
            for stream in streams.values():
                stream.close()


@dataclass
class _Stream:
    """One pod's log, followed by a thread that puts its lines on ``lines``."""

    client: Logs
    pod: Mapping[str, Any]
    lines: queue.Queue[LogLine | None]
    after: _Stream | None = None  # a stream of the same pod that broke off: skip what it had

    def __post_init__(self) -> None:
        self.done = threading.Event()
        self.error: str | None = None  # what the API said when it refused the log
        # The time of the last line put on ``lines``: final once ``done`` is set. A stream that
        # follows one that broke off skips the lines that one had (it gets the whole log again).
        self.last_at: int = self.after.last_at if self.after else -1
        self._skip_to = self.last_at
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def resumable(self, pod: Mapping[str, Any]) -> bool:
        """The stream broke off while the container still runs."""
        return self.done.is_set() and self.error is None and not terminated(pod, CONTAINER)

    def _put(self, raw: bytes, before: LogLine | None) -> LogLine:
        meta = self.pod["metadata"]
        line = parse_line(raw.decode(errors="replace"), meta["name"], node_index(self.pod), before)
        if line.at > self._skip_to:
            self.lines.put(line)
            self.last_at = max(self.last_at, line.at)
        return line

    def _run(self) -> None:
        from kubernetes.client.exceptions import ApiException

        meta = self.pod["metadata"]
        try:
            self._response = self.client._core.read_namespaced_pod_log(
                meta["name"],
                meta.get("namespace", self.client.namespace),
                container=CONTAINER,
                follow=True,
                timestamps=True,
                _preload_content=False,
            )
            before: LogLine | None = None
            pending = b""
            for chunk in self._response.stream(amt=None, decode_content=False):
                pending += chunk
                *complete, pending = pending.split(b"\n")
                for raw in complete:
                    before = self._put(raw, before)
            if pending:
                self._put(pending, before)
        except ApiException as error:
            self.error = (
                f"cannot read the log of pod {meta['name']}: {self.client._api_error(error, None)}"
            )
        except Exception:
            pass  # a stream that broke off is followed again while its pod runs
        finally:
            self.done.set()
            self.lines.put(None)  # wakes the reader

    def close(self) -> None:
        if self._response is not None:
            with suppress(Exception):
                self._response.close()
