"""Progress: rank 0's progress record for the DDPJob's status. The run log (``metrics.jsonl``)
is :mod:`ddp_trainer.reporting.run_log`; the trainer's Prometheus metrics are
:mod:`ddp_trainer.reporting.prometheus`.

Rank 0 writes the record where the operator told it (``DDPJOB_PROGRESS_INTO``): into the
annotation ``ddp.dev/progress`` of its own pod, the one change the namespace's trainer account
may make (an admission policy holds it to the pod its token is bound to), or into its job's
progress ConfigMap (``contract.progress_configmap``), the one object a job's own account may
patch. The operator validates it and copies it into ``status.progress``. Reporting is best
effort: it runs in a background thread with short timeouts, logs its first failure once, and
never fails or stalls training.
"""

from __future__ import annotations

import json
import logging
import math
import os
import ssl
import threading
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddp_api.contract import (
    ENV_JOB_NAME,
    ENV_JOB_NAMESPACE,
    ENV_POD_NAME,
    ENV_PROGRESS_INTERVAL,
    ENV_PROGRESS_INTO,
    PROGRESS_ANNOTATION,
    PROGRESS_INTO_POD,
    PROGRESS_KEY,
    pod_path,
    progress_configmap,
    progress_configmap_path,
    rfc3339,
)

log = logging.getLogger("ddp_trainer.progress")

DEFAULT_INTERVAL_S = 10.0


def progress_record(
    *,
    epoch: int,
    step: int,
    total_steps: int,
    loss: float,
    samples_per_second: float,
    last_checkpoint: str | None,
    world_size: int,
    now: float,
    held_at_step: int | None = None,
    groups: int | None = None,
) -> dict[str, Any]:
    """The record of ``status.progress`` that rank 0 reports (the operator copies it).

    Every field is present: ``heldAtStep`` is null unless the run waits at a hold point, and a
    loss that is not finite (a step that diverged, or none run yet) is null, since JSON has no
    NaN and the API server refuses it. ``groups`` (PerStep mode only): the replica groups that
    trained the last committed step.
    """
    loss = float(loss)
    record = {
        "epoch": int(epoch),
        "step": int(step),
        "totalSteps": int(total_steps),
        "loss": round(loss, 4) if math.isfinite(loss) else None,  # as `kubectl get` prints it
        "samplesPerSecond": round(float(samples_per_second), 3),
        "lastCheckpoint": last_checkpoint or "",
        "updatedAt": rfc3339(now),
        "worldSize": int(world_size),
        "heldAtStep": held_at_step,
    }
    return record if groups is None else {**record, "groups": int(groups)}


def _text(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"), allow_nan=False)


def configmap_patch(record: dict[str, Any]) -> dict[str, Any]:
    """The merge patch of the progress ConfigMap that carries ``record``."""
    return {"data": {PROGRESS_KEY: _text(record)}}


def pod_patch(record: dict[str, Any]) -> dict[str, Any]:
    """The merge patch of rank 0's own pod that carries ``record``: that one annotation, the
    only change the admission policy allows (any other field in the patch is refused)."""
    return {"metadata": {"annotations": {PROGRESS_ANNOTATION: _text(record)}}}


def should_report(now: float, last_report: float | None, interval_s: float, final: bool) -> bool:
    """Rate limit: at most once per `interval_s`, except a final (or urgent) report."""
    return final or last_report is None or now - last_report >= interval_s


def reporting_target(environ: dict[str, str] | os._Environ[str]) -> tuple[str, str] | None:
    """(name, namespace) of the DDPJob to report to, when running in a cluster."""
    name, namespace = environ.get(ENV_JOB_NAME), environ.get(ENV_JOB_NAMESPACE)
    return (name, namespace) if name and namespace else None


def progress_pod(environ: Mapping[str, str]) -> str | None:
    """The pod whose annotation takes the record (this pod: the downward API's name, else the
    hostname, which the operator sets to it); None: the job's ConfigMap takes it."""
    if environ.get(ENV_PROGRESS_INTO) != PROGRESS_INTO_POD:
        return None
    return environ.get(ENV_POD_NAME) or environ.get("HOSTNAME") or None


def interval_from_env(environ: dict[str, str] | os._Environ[str]) -> float:
    try:
        return max(0.0, float(environ.get(ENV_PROGRESS_INTERVAL, DEFAULT_INTERVAL_S)))
    except ValueError:
        return DEFAULT_INTERVAL_S


SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class InClusterProgressWriter:
    """PATCHes rank 0's own pod (``pod``), or else the job's progress ConfigMap, with the pod's
    ServiceAccount token, using only the standard library: importing the `kubernetes` package
    takes seconds on a busy CPU, long enough for a short run to end before its first report
    was sent."""

    def __init__(self, host: str, port: str, sa_dir: Path = SA_DIR, pod: str | None = None):
        self.base = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        self.token_file = sa_dir / "token"
        self.context = ssl.create_default_context(cafile=str(sa_dir / "ca.crt"))
        self.pod = pod

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> InClusterProgressWriter | None:
        host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
        if not host or not port or not (SA_DIR / "token").exists():
            return None
        return cls(host, port, pod=progress_pod(environ))

    def patch_progress(self, namespace: str, job: str, record: dict[str, Any]) -> None:
        if self.pod:
            self.patch(pod_path(namespace, self.pod), pod_patch(record))
        else:
            self.patch_configmap(namespace, job, configmap_patch(record))

    def patch_configmap(self, namespace: str, job: str, patch: dict[str, Any]) -> None:
        """A merge patch of the job's progress ConfigMap (raises on any refusal)."""
        self.patch(progress_configmap_path(namespace, job), patch)

    def patch(self, path: str, patch: dict[str, Any]) -> None:
        """A merge patch of the object at ``path`` (raises on any refusal)."""
        request = urllib.request.Request(
            self.base + path,
            data=json.dumps(patch).encode(),
            method="PATCH",
            headers={
                "Content-Type": "application/merge-patch+json",
                "Accept": "application/json",
                # Read per request: the kubelet rotates projected tokens.
                "Authorization": f"Bearer {self.token_file.read_text().strip()}",
            },
        )
        with urllib.request.urlopen(request, timeout=5, context=self.context) as response:
            response.read()


class KubeconfigProgressWriter:
    """Out of a cluster: the `kubernetes` client on $KUBECONFIG (the trainer run by hand,
    reporting to a DDPJob of a cluster)."""

    def __init__(self, kubeconfig: str, pod: str | None = None):
        from kubernetes import client, config

        config.load_kube_config(config_file=kubeconfig)
        self.api = client.CoreV1Api()
        self.pod = pod

    def patch_progress(self, namespace: str, job: str, record: dict[str, Any]) -> None:
        if self.pod:
            self.api.patch_namespaced_pod(
                self.pod, namespace, pod_patch(record), _request_timeout=5
            )
        else:
            self.api.patch_namespaced_config_map(
                progress_configmap(job), namespace, configmap_patch(record), _request_timeout=5
            )


ProgressWriter = InClusterProgressWriter | KubeconfigProgressWriter


def progress_writer(environ: Mapping[str, str]) -> ProgressWriter:
    """In-cluster when the pod has a ServiceAccount token, else $KUBECONFIG; raises if neither."""
    writer = InClusterProgressWriter.from_env(environ)
    if writer is not None:
        return writer
    kubeconfig = environ.get("KUBECONFIG")
    if kubeconfig:
        return KubeconfigProgressWriter(kubeconfig, progress_pod(environ))
    raise RuntimeError("no in-cluster ServiceAccount token and KUBECONFIG is not set")


class ProgressReporter:
    """Writes rank 0's progress record for one DDPJob from a background thread, rate-limited.

    The writer is made as soon as the reporter starts, not at the first report, and
    :meth:`close` waits for the final report, so that even a run of a few seconds is seen.
    """

    def __init__(self, name: str, namespace: str, interval_s: float = DEFAULT_INTERVAL_S):
        self.name, self.namespace, self.interval_s = name, namespace, interval_s
        self.sent = 0
        self._pending: dict[str, Any] | None = None
        self._last: float | None = None
        self._urgent = False  # the pending report skips the rate limit (final, or a hold)
        self._warned = False
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._writer: ProgressWriter | None = None
        self._thread = threading.Thread(target=self._run, name="progress-reporter", daemon=True)
        self._thread.start()

    @classmethod
    def from_env(cls) -> ProgressReporter | None:
        target = reporting_target(os.environ)
        if target is None:
            return None
        return cls(*target, interval_s=interval_from_env(os.environ))

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def offer(self, record: dict[str, Any], final: bool = False, urgent: bool = False) -> None:
        """Hand over the newest progress record; never blocks on the network.

        ``final`` and ``urgent`` reports go at once; others at most once per interval.
        """
        with self._lock:
            self._pending = record
            self._urgent = self._urgent or final or urgent
        self._wake.set()

    def _warn_once(self, error: Exception) -> None:
        # Best effort: say so once, keep training, try again at the next report.
        if not self._warned:
            self._warned = True
            log.warning(
                "cannot report progress to ddpjob %s/%s (training goes on): %s",
                self.namespace,
                self.name,
                error,
            )

    def _run(self) -> None:
        try:
            self._writer = progress_writer(os.environ)
        except Exception as error:
            self._warn_once(error)
        while True:
            with self._lock:
                record, stop, urgent = self._pending, self._stop, self._urgent
                due = record is not None and should_report(
                    time.monotonic(), self._last, self.interval_s, urgent
                )
                if due:
                    self._pending, self._urgent = None, False
            if due and record is not None and self._writer is not None:
                self._last = time.monotonic()
                try:
                    self._writer.patch_progress(self.namespace, self.name, record)
                    self.sent += 1
                except Exception as error:
                    self._warn_once(error)
                    with self._lock:  # try it again, unless a newer report came meanwhile
                        if self._pending is None:
                            self._pending, self._urgent = record, self._urgent or urgent
                    time.sleep(1.0)
                continue
            if stop and (self._pending is None or self._writer is None):
                return
            if record is None or self._last is None:
                wait: float | None = self.interval_s or None
            else:
                wait = max(self._last + self.interval_s - time.monotonic(), 0.05)
            self._wake.wait(timeout=wait)
            self._wake.clear()

    def close(self, timeout_s: float = 15.0) -> None:
        """Send what is pending (the final report) and stop, waiting at most `timeout_s`."""
        with self._lock:
            self._stop = True
            self._urgent = True
        self._wake.set()
        self._thread.join(timeout_s)
