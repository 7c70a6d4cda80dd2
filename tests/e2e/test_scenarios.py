"""End to end on this machine: the operator's own pods run as real processes.

One ``LocalStack`` for the module: the embedded control plane (no kwok nodes), the operator
under its manifests' RBAC, and the test kubelet, which runs every pod the operator creates as
real processes in their own network namespaces (torchrun, c10d rendezvous through the job's
store pod, gloo, checkpoints on a PersistentVolumeClaim backed by a host folder). Each scenario
starts from ``kubectl apply`` of the YAML in ``manifests/examples/``, in a namespace of its own.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from ddp_devcluster.polling import until
from ddp_devcluster.pytest_plugin import unavailable
from ddp_devcluster.stack import EXAMPLES, LocalStack
from ddp_trainer.progress import read_metrics

pytestmark = pytest.mark.e2e
T = TypeVar("T")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with LocalStack(
        nodes=3,
        workdir=tmp_path_factory.mktemp("stack"),
        operator_env={"DDP_BACKOFF_BASE_S": "1", "DDP_RESYNC_S": "5"},
        log=lambda m: print(f"\n[stack] {m}"),
    ) as s:
        if s.kubelet is not None and s.kubelet.mode != "netns":
            unavailable("the test kubelet has no network namespaces here (needs root)")
        yield s


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

    def at_step(self, job: str, step: int, timeout_s: float = 180) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            p = self.progress(job)
            return p if int(p.get("step") or 0) >= step else None

        return self.until(f"{job} at step {step}", reached, timeout_s)

    def workers(self, job: str) -> dict[str, str]:
        """Name -> uid of the job's node pods."""
        selector = f"ddp.dev/job-name={job},ddp.dev/role=worker"
        out = json.loads(self.k("get", "pods", "-l", selector, "-o", "json"))
        return {p["metadata"]["name"]: p["metadata"]["uid"] for p in out["items"]}

    def claim(self, name: str) -> Path:
        return self.s.claim_dir(name, self.ns)

    def logs(self, pod: str, container: str = "trainer") -> str:
        assert self.s.kubelet is not None
        return self.s.kubelet.logs(self.ns, pod, container)


@pytest.fixture
def sc(stack: LocalStack) -> Scenario:
    return Scenario(stack)


def longer_digits(job: dict[str, Any]) -> None:
    """10 epochs (220 steps) instead of the example's 3 (66): a scenario that acts mid-run must
    act well before the end, however fast the run goes on this machine."""
    job["spec"]["trainer"]["epochs"] = 10


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


def test_digits_succeeds_with_checkpoints_and_progress_in_kubectl_get(sc: Scenario) -> None:
    sc.apply("checkpoint-pvc.yaml", "digits.yaml")
    status = sc.succeeded("digits")
    progress = status["progress"]
    assert progress["step"] == progress["totalSteps"] and progress["worldSize"] == 2
    assert status["restarts"] == 0

    ckpt = sc.claim("digits-checkpoints")
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert (ckpt / manifest["latest"]).is_file()
    assert manifest["latest"] == f"step-{progress['step']:08d}.pt"
    assert progress["lastCheckpoint"].endswith(manifest["latest"])
    end = next(r for r in read_metrics(ckpt) if r.get("event") == "end")
    assert end["testAccuracy"] >= 0.85

    header, row = sc.k("get", "ddpj", "digits").splitlines()[:2]
    table = dict(zip(header.split(), row.split(), strict=False))
    assert table["PHASE"] == "Succeeded"
    assert int(table["EPOCH"]) == progress["epoch"] and int(table["STEP"]) == progress["step"]
    assert float(table["LOSS"]) == pytest.approx(progress["loss"])


def test_elastic_scale_up_and_down_mid_run_loses_at_most_one_checkpoint_interval(
    sc: Scenario,
) -> None:
    every = 10

    def longer(job: dict[str, Any]) -> None:
        # More steps than the example's 60, so that two resizes (each a re-rendezvous)
        # happen well before the end (an epoch of its corpus has about 90).
        job["spec"]["trainer"]["maxSteps"] = 150
        job["spec"]["trainer"]["epochs"] = 2

    sc.apply("checkpoint-pvc.yaml", "charlm-elastic.yaml", edit=longer)
    first = sc.at_step("charlm", every + 1)
    assert first["worldSize"] == 2
    sc.k("scale", "ddpjob/charlm", "--replicas", "3")
    up = sc.until("world size 3", lambda: (p := sc.progress("charlm")).get("worldSize") == 3 and p)
    sc.at_step("charlm", int(up["step"]) + every)  # a checkpoint at world size 3
    sc.k("scale", "ddpjob/charlm", "--replicas", "2")
    sc.until("world size 2 again", lambda: sc.progress("charlm").get("worldSize") == 2)
    assert sc.status("charlm")["worldSize"] == 2
    status = sc.succeeded("charlm")
    assert status["progress"]["step"] == status["progress"]["totalSteps"] == 150

    rows = read_metrics(sc.claim("charlm-checkpoints"))
    sizes = [r["worldSize"] for r in rows if r.get("event") == "step"]
    changes = [w for i, w in enumerate(sizes) if i == 0 or w != sizes[i - 1]]
    assert changes == [2, 3, 2]
    restarts = resumes(rows)
    assert len(restarts) >= 2
    for before, after in restarts:
        assert after >= before - every + 1, f"lost steps {after}..{before}"


def test_losing_the_rank_0_pod_mid_run_recovers_and_counts_a_restart(sc: Scenario) -> None:
    sc.apply("checkpoint-pvc.yaml", "digits.yaml", edit=longer_digits)
    sc.at_step("digits", 25)
    rank0 = sc.until(
        "the pod of rank 0",
        lambda: next((p for p in sc.workers("digits") if "rank0 " in sc.logs(p)), None),
    )
    assert int(sc.progress("digits")["step"]) < 180, "too close to the end to test recovery"
    sc.k("delete", "pod", rank0, "--wait=false")
    status = sc.succeeded("digits")
    assert status["restarts"] == 1
    assert any(
        "PodDisrupted" in line and rank0 in line
        for line in sc.k(
            "get", "events", "--field-selector", "involvedObject.name=digits"
        ).splitlines()
    )
    rows = read_metrics(sc.claim("digits-checkpoints"))
    assert [before - after < 20 for before, after in resumes(rows)] == [True]


def test_suspend_keeps_the_checkpoint_and_resume_continues_from_it(sc: Scenario) -> None:
    sc.apply("checkpoint-pvc.yaml", "digits.yaml", edit=longer_digits)
    sc.at_step("digits", 25)
    sc.k("patch", "ddpjob", "digits", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    sc.until("Suspended", lambda: sc.status("digits").get("phase") == "Suspended")
    sc.until(
        "no pods", lambda: not sc.k("get", "pods", "-l", "ddp.dev/job-name=digits", "-o", "name")
    )
    ckpt = sc.claim("digits-checkpoints")
    kept = json.loads((ckpt / "manifest.json").read_text())["latest"]
    kept_step = int(kept.split("-")[1].split(".")[0])
    assert kept_step >= 20 and (ckpt / kept).is_file()

    sc.k("patch", "ddpjob", "digits", "--type=merge", "-p", '{"spec":{"suspend":false}}')
    status = sc.succeeded("digits")
    assert status["restarts"] == 0  # suspending is no failure
    restarts = resumes(read_metrics(ckpt))
    assert len(restarts) == 1 and restarts[0][1] == kept_step + 1


def test_an_operator_killed_mid_run_restarts_without_duplicates(sc: Scenario) -> None:
    op = sc.s.operator
    assert op is not None
    sc.apply("checkpoint-pvc.yaml", "digits.yaml", edit=longer_digits)
    sc.at_step("digits", 10)
    before = sc.workers("digits")
    op.kill()
    time.sleep(2)
    op.start()
    status = sc.succeeded("digits")
    after = sc.workers("digits")
    assert after == before and len(after) == 2  # the same pods: none duplicated or replaced
    assert status["restarts"] == 0


def test_a_users_own_torchrun_script_from_a_configmap_succeeds(sc: Scenario) -> None:
    sc.apply("checkpoint-pvc.yaml", "own-script.yaml")
    sc.succeeded("own-script")
    pods = sc.workers("own-script")
    logs = "\n".join(sc.logs(p) for p in pods)
    assert "step 200/200" in logs and "world 2" in logs
    assert (sc.claim("own-script-checkpoints") / "own-script.pt").is_file()
