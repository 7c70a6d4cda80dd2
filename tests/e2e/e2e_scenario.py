"""The end-to-end stack, and a scenario's view of it: one namespace, kubectl, polling and holds."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from ddp_devcluster import node
from ddp_devcluster.polling import until
from ddp_devcluster.pytest_plugin import unavailable
from ddp_devcluster.stack import EXAMPLES, LocalStack
from ddp_trainer import hold

T = TypeVar("T")
# Restarts at once and resyncs often: the scenarios wait on what the operator does next.
OPERATOR_ENV = {"DDP_BACKOFF_BASE_S": "1", "DDP_RESYNC_S": "5"}


def local_stack(factory: pytest.TempPathFactory, name: str, kueue: bool = False) -> LocalStack:
    """A started LocalStack with the operator as a process (killed and restarted by the
    scenarios); the caller stops it."""
    why = node.requirements()
    if why:
        unavailable(f"the end-to-end stack needs a real node: {why}")
    return LocalStack(
        workdir=factory.mktemp(name),
        operator_env=OPERATOR_ENV,
        log=lambda m: print(f"\n[{name}] {m}", flush=True),
        kueue=kueue,
    ).start()


class Scenario:
    """One namespace of the stack, with kubectl and polling helpers."""

    def __init__(self, stack: LocalStack):
        self.s = stack
        self.ns = f"e2e-{uuid.uuid4().hex[:6]}"
        stack.kubectl("create", "namespace", self.ns)

    def k(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return str(self.s.kubectl(*args, "-n", self.ns, input=input, check=check).stdout)

    def apply(self, *files: str, edit: Callable[[dict[str, Any]], None] | None = None) -> None:
        """``kubectl apply`` of example files; ``edit`` may adjust the DDPJob first."""
        docs = [d for f in files for d in yaml.safe_load_all((EXAMPLES / f).read_text()) if d]
        for d in docs:
            if edit is not None and d["kind"] == "DDPJob":
                edit(d)
        self.k("apply", "-f", "-", input=yaml.safe_dump_all(docs))

    def status(self, job: str) -> dict[str, Any]:
        return dict(self.s.job(job, self.ns).get("status") or {})

    def progress(self, job: str) -> dict[str, Any]:
        return dict(self.status(job).get("progress") or {})

    def until(self, what: str, probe: Callable[[], T | None], timeout_s: float = 180) -> T:
        return until(what, probe, timeout_s, 0.5, lambda: self.s.diagnostics(self.ns))

    def succeeded(self, job: str, timeout_s: float = 300) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            st = self.status(job)
            if st.get("phase") == "Failed":
                raise AssertionError(f"{job} failed: {st}\n{self.s.diagnostics(self.ns)}")
            return st if st.get("phase") == "Succeeded" else None

        return self.until(f"{job} Succeeded", done, timeout_s)

    def held(self, job: str, step: int, timeout_s: float = 180) -> dict[str, Any]:
        """Waits until the job pauses after ``step`` (spec.trainer.holdAtSteps); its progress."""

        def pausing() -> dict[str, Any] | None:
            p = self.progress(job)
            return p if p.get("heldAtStep") == step else None

        return self.until(f"{job} held after step {step}", pausing, timeout_s)

    def release(self, claim: str, step: int) -> None:
        """Lets a job held after ``step`` go on (its release file in the checkpoint folder)."""
        hold.release(self.claim(claim), step)

    def workers(self, job: str) -> dict[str, str]:
        """Name -> uid of the job's node pods."""
        selector = f"ddp.dev/job-name={job},ddp.dev/role=worker"
        out = json.loads(self.k("get", "pods", "-l", selector, "-o", "json"))
        return {p["metadata"]["name"]: p["metadata"]["uid"] for p in out["items"]}

    def claim(self, name: str) -> Path:
        return self.s.claim_dir(name, self.ns)

    def logs(self, pod: str, container: str = "trainer") -> str:
        return self.s.logs(self.ns, pod, container)


def holding_at(*steps: int) -> Callable[[dict[str, Any]], None]:
    """An edit that makes the job pause after ``steps`` until released: a scenario acts at a
    known step, however fast or slow this machine trains."""

    def edit(job: dict[str, Any]) -> None:
        job["spec"]["trainer"]["holdAtSteps"] = list(steps)

    return edit


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
