"""A job's merged logs, whole or followed while its pods run (``kubectl ddp logs [-f]``), or
read from what its nodes kept on the checkpoint volume once the pods are gone."""

from __future__ import annotations

import posixpath
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from ddp_api.contract import LOGS_DIR, parse_rfc3339
from ddp_api.ddpjob import TERMINAL_PHASES
from ddp_api.pods import CONTAINER, selector

from .connection import REQUEST_TIMEOUT
from .errors import DDPError, NoKeptLogs
from .jobs import status_of
from .kept_logs import node_logs, omitted_note, parse_dump
from .loglines import LiveMerge, LogLine, merge_logs, parse_line, parse_pod_log, pick_rank
from .objects import InvalidJob, checkpoint_path, logs_reader_pod, reader_image
from .pod_state import node_index, started, terminated
from .volume import VolumeReader

POD_LIST_INTERVAL_S = 2.0  # how often `logs -f` looks for new pods
FOLLOW_HOLD_S = 1.0  # how long `logs -f` holds a line for earlier ones of other pods
# What one reader pod prints of the kept logs, compressed: the API returns only the kubelet's
# newest file of a container's log, 10 MiB unless the cluster's containerLogMaxSize says less.
READ_BUDGET_BYTES = 8 * 2**20


class Logs(VolumeReader):
    """The logs of a job's node pods, each line knowing its node and global rank."""

    def _workers(self, name: str) -> list[dict[str, Any]]:
        """The job's node pods, by node index."""
        with self._calls():
            pods = self._core.list_namespaced_pod(
                self.namespace, label_selector=selector(name), _request_timeout=REQUEST_TIMEOUT
            )
        items = self._api.sanitize_for_serialization(pods).get("items") or []
        return sorted(items, key=lambda p: (node_index(p) is None, node_index(p) or 0))

    def logs(
        self,
        name: str,
        *,
        follow: bool = False,
        rank: int | None = None,
        from_volume: bool = False,
        image: str | None = None,
        timeout_s: float = 180.0,
        on_note: Callable[[str], object] | None = None,
    ) -> Iterator[LogLine]:
        """The lines of every node's log in time order, each knowing its node and global rank
        (:meth:`LogLine.show` prints ``[node-0 rank1] text``); only rank ``rank``'s when given.
        ``follow`` streams until the job has finished and its pods' logs have ended.

        From the pods' logs while the job has pods (a replaced pod's log has only its own
        attempt); once it has none (or with ``from_volume``: every attempt of every node, also
        of pods replaced since), from the logs its nodes kept on the checkpoint volume
        (:meth:`kept_logs`; ``image`` and ``timeout_s`` are its reader pod's). ``on_note`` is
        told where the lines come from when that is not the pods."""
        job = self.get(name)  # JobNotFound before anything else
        note = on_note or (lambda text: None)
        if from_volume:
            if follow:
                raise DDPError(
                    "logs: --follow streams the pods' logs; --from-volume reads what"
                    " they kept: give one of them"
                )
            yield from pick_rank(
                self.kept_logs(name, image=image, timeout_s=timeout_s, on_note=note, job=job), rank
            )
            return
        pods = self._workers(name)
        if not pods and (not follow or status_of(job).phase in TERMINAL_PHASES):
            if not (job.get("spec") or {}).get("checkpoint"):
                note(f"ddpjob {name} has no pods, and no checkpoint volume that kept their logs")
                return
            note(f"ddpjob {name} has no pods: reading the logs its nodes kept on its volume")
            yield from pick_rank(
                self.kept_logs(name, image=image, timeout_s=timeout_s, on_note=note, job=job), rank
            )
            return
        if follow:
            yield from self._follow(name, rank)
            return
        logs = [
            parse_pod_log(self._pod_log(p, CONTAINER, True), p["metadata"]["name"], node_index(p))
            for p in pods
        ]
        yield from pick_rank(merge_logs(logs), rank)

    def kept_logs(
        self,
        name: str,
        *,
        image: str | None = None,
        timeout_s: float = 180.0,
        on_note: Callable[[str], object] | None = None,
        job: Mapping[str, Any] | None = None,
    ) -> list[LogLine]:
        """Every node's log as its pods kept it on the checkpoint volume (``<path>/logs/``,
        ``ddp_trainer.launch.keptlog``), merged in time order, read by a short-lived pod
        (:func:`~ddp_client.objects.logs_reader_pod`); only lines since the job was created.
        NoKeptLogs when there are none. ``on_note`` is told of files too large to carry."""
        job = job if job is not None else self.get(name)
        try:
            image = image or reader_image(job, self._workers(name))
            manifest = logs_reader_pod(job, image, READ_BUDGET_BYTES)
            folder = posixpath.join(checkpoint_path(job, "logs"), LOGS_DIR)
        except InvalidJob as error:
            raise NoKeptLogs(str(error)) from None
        dump = parse_dump(self._read_volume(name, manifest, "kept logs", NoKeptLogs, timeout_s))
        created = parse_rfc3339((job.get("metadata") or {}).get("creationTimestamp"))
        since = int(created.timestamp()) * 1_000_000_000 if created else None
        logs = node_logs(dump.files, name, since)
        if not any(logs) and not dump.omitted:
            raise NoKeptLogs(
                f"ddpjob {name} kept no logs in {folder} on its checkpoint volume: only pods that"
                " run the bundled trainer's node wrapper (ddp_trainer.node) keep them"
            )
        said = omitted_note(dump.omitted, name)
        if said and on_note is not None:
            on_note(said)
        return merge_logs(logs)

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
