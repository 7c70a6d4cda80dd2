"""What a pod's status says, as the client reads it (without I/O)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddp_api.ddpjob import TERMINAL_PHASES
from ddp_api.pods import IMAGE_PULL_REASONS, LABEL_INDEX


def node_index(pod: Mapping[str, Any]) -> int | None:
    value = ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_INDEX)
    return int(value) if value is not None and str(value).isdigit() else None


def container_state(pod: Mapping[str, Any], container: str) -> Mapping[str, Any]:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            return dict(status.get("state") or {})
    return {}


def started(pod: Mapping[str, Any], container: str) -> bool:
    state = container_state(pod, container)
    return "running" in state or "terminated" in state


def terminated(pod: Mapping[str, Any], container: str) -> bool:
    return "terminated" in container_state(pod, container) or (
        (pod.get("status") or {}).get("phase") in TERMINAL_PHASES
    )


def pod_trouble(pod: Mapping[str, Any]) -> str:
    """Why a pod has not finished, as a pod's status says it."""
    status = pod.get("status") or {}
    for c in status.get("containerStatuses") or []:
        waiting = (c.get("state") or {}).get("waiting")
        if waiting:
            return f"{waiting.get('reason')}: {waiting.get('message') or ''}".strip(": ")
    for cond in status.get("conditions") or []:
        if cond.get("status") == "False" and cond.get("message"):
            return f"{cond.get('reason')}: {cond['message']}"
    return f"phase {status.get('phase', 'unknown')}"


def image_trouble(pod: Mapping[str, Any]) -> str:
    """Why the kubelet cannot pull a container's image ("" when it can): the waiting reason
    and message, which a wait does not mend (a wrong name, a registry the cluster cannot
    reach)."""
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (c.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_PULL_REASONS:
            return f"{waiting['reason']}: {waiting.get('message') or ''}".strip(": ")
    return ""
