"""A job's run log (``metrics.jsonl`` on its checkpoint volume), read by a short-lived pod
through its log so that it works on any cluster, and drawn (``kubectl ddp plot``)."""

from __future__ import annotations

import time
from contextlib import suppress
from pathlib import Path
from typing import Any

from ddp_api.contract import parse_run_log
from ddp_api.ddpjob import TERMINAL_PHASES

from .connection import REQUEST_TIMEOUT
from .curves import Plot, curves, draw_curves
from .errors import NoMetrics
from .logs import Logs
from .objects import InvalidJob, metrics_reader_pod, reader_image
from .pod_state import pod_trouble


class RunLogReader(Logs):
    """Reads a job's run log and draws its curves."""

    def metrics(
        self, name: str, *, image: str | None = None, timeout_s: float = 180.0
    ) -> list[dict[str, Any]]:
        """The lines of the job's metrics.jsonl, read from its checkpoint volume by a
        short-lived pod (see :func:`~ddp_client.objects.metrics_reader_pod`) through
        its log, so that it works on any cluster. ``image`` overrides the job's image."""
        job = self.get(name)
        try:
            manifest = metrics_reader_pod(job, image or reader_image(job, self._workers(name)))
        except InvalidJob as error:
            raise NoMetrics(str(error)) from None
        with self._calls():
            created = self._core.create_namespaced_pod(
                self.namespace,
                self._models.V1Pod.model_validate(manifest),
                _request_timeout=REQUEST_TIMEOUT,
            )
        pod_name = str(self._api.sanitize_for_serialization(created)["metadata"]["name"])
        try:
            pod = self._pod_finished(pod_name, timeout_s)
            text = self._pod_log(pod, manifest["spec"]["containers"][0]["name"], False)
            if pod["status"]["phase"] != "Succeeded":
                said = text.strip().splitlines()[-1:] or ["no output"]
                raise NoMetrics(f"cannot read ddpjob {name}'s metrics.jsonl: {said[0]}")
            return parse_run_log(text)
        finally:
            self._delete_pod(pod_name)

    def _pod_finished(self, pod_name: str, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            with self._calls():
                pod = self._api.sanitize_for_serialization(
                    self._core.read_namespaced_pod(
                        pod_name, self.namespace, _request_timeout=REQUEST_TIMEOUT
                    )
                )
            if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
                return dict(pod)
            if time.monotonic() >= deadline:
                raise NoMetrics(
                    f"pod {pod_name}, which reads metrics.jsonl, did not finish within"
                    f" {timeout_s:.0f}s: {pod_trouble(pod)}"
                )
            time.sleep(0.5)

    def _delete_pod(self, pod_name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        # Owned by the job: should this fail, the garbage collector deletes it with the job.
        with suppress(ApiException):
            self._core.delete_namespaced_pod(
                pod_name, self.namespace, grace_period_seconds=0, _request_timeout=REQUEST_TIMEOUT
            )

    def plot(
        self,
        name: str,
        path: str | Path,
        *,
        image: str | None = None,
        timeout_s: float = 180.0,
    ) -> Plot:
        """Draws the job's loss and learning rate by step (from metrics.jsonl) to ``path``."""
        found = curves(self.metrics(name, image=image, timeout_s=timeout_s))
        if found.empty:
            raise NoMetrics(f"ddpjob {name}'s metrics.jsonl has no step lines yet")
        return draw_curves(found, path, title=f"DDPJob {name}")
