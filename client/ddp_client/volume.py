"""A container's whole log, and short-lived pods that read a job's checkpoint volume and print
what they read to their log, read back through the API so that it works on any cluster
(``kubectl ddp plot``'s metrics.jsonl, ``kubectl ddp logs``' kept logs)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextlib import suppress
from typing import Any

from ddp_api.ddpjob import TERMINAL_PHASES
from ddp_api.pods import PodPhase

from .connection import REQUEST_TIMEOUT
from .errors import ClusterUnreachable, DDPError
from .jobs import Jobs
from .pod_state import image_trouble, pod_trouble, started


class VolumeReader(Jobs):
    """Reads pods' logs, and the checkpoint volume through a pod of its own."""

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

    def _read_volume(
        self,
        name: str,
        manifest: Mapping[str, Any],
        what: str,
        error: type[DDPError],
        timeout_s: float,
    ) -> str:
        """What the reader pod ``manifest`` printed about job ``name``'s ``what``; ``error``
        when it failed or did not finish in ``timeout_s``. The pod is deleted afterwards."""
        with self._calls():
            created = self._core.create_namespaced_pod(
                self.namespace,
                self._models.V1Pod.model_validate(manifest),
                _request_timeout=REQUEST_TIMEOUT,
            )
        pod_name = str(self._api.sanitize_for_serialization(created)["metadata"]["name"])
        try:
            pod = self._pod_finished(pod_name, what, error, timeout_s)
            text = self._pod_log(pod, manifest["spec"]["containers"][0]["name"], False)
            if pod["status"]["phase"] != PodPhase.SUCCEEDED:
                said = text.strip().splitlines()[-1:] or ["no output"]
                raise error(f"cannot read ddpjob {name}'s {what}: {said[0]}")
            return text
        finally:
            self._delete_pod(pod_name)

    def _pod_finished(
        self, pod_name: str, what: str, error: type[DDPError], timeout_s: float
    ) -> dict[str, Any]:
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
            trouble = image_trouble(pod)
            if trouble:
                image = pod["spec"]["containers"][0].get("image")
                raise error(
                    f"pod {pod_name}, which reads {what}, cannot pull image {image} ({trouble});"
                    " name the job's image with --image"
                )
            if time.monotonic() >= deadline:
                raise error(
                    f"pod {pod_name}, which reads {what}, did not finish within"
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
