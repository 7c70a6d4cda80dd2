"""DDPJobs as the operator reads them, and what its rendered pods carry, for its unit tests."""

from __future__ import annotations

from typing import Any

from ddp_api.ddpjob import DDPJob


def ddpjob(
    spec: dict[str, Any],
    name: str = "j",
    namespace: str = "ns",
    uid: str = "u-1",
    labels: dict[str, str] | None = None,
) -> DDPJob:
    """A DDPJob of ``spec`` as read from the API server (a uid, generation 1)."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid, "generation": 1}
    if labels is not None:
        metadata["labels"] = labels
    return DDPJob.model_validate({"metadata": metadata, "spec": spec})


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    """The first container's environment: name -> value (or valueFrom)."""
    return {
        e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]
    }
