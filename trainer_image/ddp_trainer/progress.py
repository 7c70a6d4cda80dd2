"""Progress: `metrics.jsonl` lines, and the DDPJob's `status.progress` patched from rank 0.

Reporting to the cluster is best effort: it runs in a background thread with short
timeouts, logs its first failure once, and never fails or stalls training.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "ddp.dev", "v1alpha1", "ddpjobs"
METRICS_FILE = "metrics.jsonl"
DEFAULT_INTERVAL_S = 10.0


class MetricsLog:
    """Appends one JSON object per line to `metrics.jsonl` (global rank 0 only)."""

    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / METRICS_FILE
        self._file = open(self.path, "a", buffering=1)  # noqa: SIM115 (lives as long as the run)

    def write(self, event: str, **fields: Any) -> None:
        line = {"event": event, "time": round(time.time(), 3), **fields}
        self._file.write(json.dumps(line) + "\n")

    def close(self) -> None:
        self._file.close()


def read_metrics(directory: Path | str) -> list[dict[str, Any]]:
    """The lines of a checkpoint folder's metrics.jsonl (a torn last line is ignored)."""
    path = Path(directory) / METRICS_FILE
    if not path.exists():
        return []
    lines = []
    for text in path.read_text().splitlines():
        try:
            lines.append(json.loads(text))
        except json.JSONDecodeError:
            continue
    return lines


def rfc3339(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def progress_patch(
    *,
    epoch: int,
    step: int,
    total_steps: int,
    loss: float,
    samples_per_second: float,
    last_checkpoint: str | None,
    world_size: int,
    now: float,
) -> dict[str, Any]:
    """The merge patch of the DDPJob status subresource that reports progress."""
    return {
        "status": {
            "progress": {
                "epoch": int(epoch),
                "step": int(step),
                "totalSteps": int(total_steps),
                "loss": round(float(loss), 4),  # as `kubectl get` prints it
                "samplesPerSecond": round(float(samples_per_second), 3),
                "lastCheckpoint": last_checkpoint or "",
                "updatedAt": rfc3339(now),
                "worldSize": int(world_size),
            }
        }
    }


def should_report(now: float, last_report: float | None, interval_s: float, final: bool) -> bool:
    """Rate limit: at most once per `interval_s`, except the final report which always goes."""
    return final or last_report is None or now - last_report >= interval_s


def reporting_target(environ: dict[str, str] | os._Environ[str]) -> tuple[str, str] | None:
    """(name, namespace) of the DDPJob to report to, when running in a cluster."""
    name, namespace = environ.get("DDPJOB_NAME"), environ.get("DDPJOB_NAMESPACE")
    return (name, namespace) if name and namespace else None


def interval_from_env(environ: dict[str, str] | os._Environ[str]) -> float:
    try:
        return max(0.0, float(environ.get("DDPJOB_PROGRESS_INTERVAL_S", DEFAULT_INTERVAL_S)))
    except ValueError:
        return DEFAULT_INTERVAL_S


def _custom_objects_api() -> Any:
    """A CustomObjectsApi from in-cluster config, else from $KUBECONFIG; None if neither."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        kubeconfig = os.environ.get("KUBECONFIG")
        if not kubeconfig:
            return None
        config.load_kube_config(config_file=kubeconfig)
    return client.CustomObjectsApi()


class ProgressReporter:
    """Patches `status.progress` of one DDPJob from a background thread, rate-limited."""

    def __init__(self, name: str, namespace: str, interval_s: float = DEFAULT_INTERVAL_S):
        self.name, self.namespace, self.interval_s = name, namespace, interval_s
        self.sent = 0
        self._pending: dict[str, Any] | None = None
        self._last: float | None = None
        self._final = False
        self._disabled = False  # no cluster config: nothing to report to
        self._warned = False
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._api: Any = None
        self._thread = threading.Thread(target=self._run, name="progress-reporter", daemon=True)
        self._thread.start()

    @classmethod
    def from_env(cls) -> ProgressReporter | None:
        target = reporting_target(os.environ)
        if target is None:
            return None
        return cls(*target, interval_s=interval_from_env(os.environ))

    def offer(self, patch: dict[str, Any], final: bool = False) -> None:
        """Hand over the newest progress; never blocks on the network."""
        with self._lock:
            self._pending = patch
            self._final = self._final or final
        self._wake.set()

    def _send(self, patch: dict[str, Any]) -> None:
        if self._api is None:
            self._api = _custom_objects_api()
            if self._api is None:
                self._disabled = True
                raise RuntimeError("no in-cluster config and KUBECONFIG is not set")
        self._api.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            self.namespace,
            PLURAL,
            self.name,
            patch,
            _request_timeout=5,
            _content_type="application/merge-patch+json",
        )

    def _run(self) -> None:
        while True:
            self._wake.wait(timeout=self.interval_s or None)
            self._wake.clear()
            with self._lock:
                patch, final, stop = self._pending, self._final, self._stop
                due = patch is not None and should_report(
                    time.monotonic(), self._last, self.interval_s, final
                )
                if due:
                    self._pending = None
            if due and patch is not None and not self._disabled:
                self._last = time.monotonic()
                try:
                    self._send(patch)
                    self.sent += 1
                except Exception as error:
                    # Best effort: say so once, keep training, try again at the next report.
                    if not self._warned:
                        self._warned = True
                        log.warning(
                            "cannot report progress to ddpjob %s/%s (training goes on): %s",
                            self.namespace,
                            self.name,
                            error,
                        )
            if stop and (self._pending is None or self._disabled):
                return

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is pending (the final report) and stop, waiting at most `timeout_s`."""
        with self._lock:
            self._stop = True
            self._final = True
        self._wake.set()
        self._thread.join(timeout_s)
