"""The pods of job "j" as the planner sees them (``plan.PodView``), for its unit tests."""

from __future__ import annotations

from typing import Any

from ddp_api import contract
from ddp_operator import render
from ddp_operator.planner import views

SERVERS = {
    render.ROLE_STORE: render.store_name("j"),
    render.ROLE_LIGHTHOUSE: contract.lighthouse_name("j"),
}


def pod(
    index: int,
    phase: str = "Running",
    uid: str = "",
    role: str = render.ROLE_WORKER,
    **changes: Any,
) -> views.PodView:
    """Node pod ``index`` (the store or the lighthouse for their ``role``), Ready while
    Running; ``changes`` sets any other field (exit_code, machine, created, finished...)."""
    name = render.worker_name("j", index) if role == render.ROLE_WORKER else SERVERS[role]
    return views.PodView(
        name=name,
        uid=uid or f"uid-{name}-{phase}",
        role=role,
        index=index,
        phase=phase,
        ready=phase == "Running",
        deleting=False,
        **changes,
    )
