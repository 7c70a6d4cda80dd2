"""A scenario's view of the end-to-end stack: the harness in one namespace, its claims' folders,
and holds."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from ddp_devcluster.harness import Harness
from ddp_devcluster.kind.stack import KindStack
from ddp_trainer import hold

# Restarts at once and resyncs often: the scenarios wait on what the operator does next.
OPERATOR_ENV = {"DDP_BACKOFF_BASE_S": "1", "DDP_RESYNC_S": "5"}
# The examples' claims that every machine mounts (ReadWriteMany): a job's pods run on several.
CLAIMS = "checkpoint-pvc-shared.yaml"


class Scenario(Harness):
    """One namespace of the stack: the harness in it, with its claims' folders."""

    timeout_s = 180

    def __init__(self, stack: KindStack):
        super().__init__(stack.kubeconfig, f"e2e-{uuid.uuid4().hex[:6]}")
        self.s = stack
        self.k("create", "namespace", self.ns, ns="")

    def operator_log(self, lines: int = 20) -> str:
        return self.s.operator_log(lines)

    def progress(self, job: str) -> dict[str, Any]:
        return dict(self.status(job).get("progress") or {})

    def release(self, claim: str, step: int) -> None:
        """Lets a job held after ``step`` go on (its release file in the checkpoint folder)."""
        hold.release(self.claim(claim), step)

    def claim(self, name: str) -> Path:
        return self.s.claim_dir(name, ns=self.ns)


def resumes(rows: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """(last step logged before a restart, first step logged after it) for every restart."""
    out: list[tuple[int, int]] = []
    last, waiting = 0, False
    for r in rows:
        if r.get("event") == "start" and last > 0:
            waiting = True
        elif r.get("event") == "step":
            if waiting:
                out.append((last, int(r["step"])))
                waiting = False
            last = max(last, int(r["step"]))
    return out


def resumed_at(rows: list[dict[str, Any]]) -> list[int]:
    """The step each restarted run resumed from (its ``start`` line), in order."""
    return [int(r["step"]) for r in rows if r.get("event") == "start" and r.get("resumedFrom")]
