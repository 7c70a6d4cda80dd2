"""End to end on the kind cluster: the operator's own pods run in real containers on four
machines.

Each scenario starts from ``kubectl apply`` of the YAML in ``manifests/examples/`` on the
tier's one ``KindStack`` (conftest.py; helpers in e2e_scenario.py): torchrun in the trainer
image, c10d rendezvous through the job's store pod, gloo, checkpoints on a ReadWriteMany
PersistentVolumeClaim that every machine mounts. A scenario that acts mid-run holds the
job at a known step (``holdAtSteps``).
"""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import pytest
import yaml
from e2e_scenario import CLAIMS, Scenario, resumed_at

from ddp_devcluster.harness import EXAMPLES, holding_at
from ddp_trainer.reporting.run_log import read_run_log

pytestmark = pytest.mark.e2e


# Stops the torchrun agent and its worker in this container (the processes of its cgroup but
# the node supervisor, its first, and this one), as on a machine that stopped answering.
FREEZE = """
import os, signal
me = os.getpid()
mine = open(f"/proc/{me}/cgroup").read()
for p in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
    try:
        if p not in (1, me) and open(f"/proc/{p}/cgroup").read() == mine:
            os.kill(p, signal.SIGSTOP)
            print(p, open(f"/proc/{p}/cmdline", "rb").read()[:80])
    except OSError as e:
        print("skipped", p, e)
"""


LAST = 20
SHARED = "charlm-checkpoints"  # a claim of checkpoint-pvc-shared.yaml no other job here uses


def test_a_node_lost_at_the_last_step_ends_the_job_succeeded_within_a_minute(sc: Scenario) -> None:
    """As seen on a real kubelet: one node finishes, its peer is lost at the last step."""

    # Its last step (the scene is its end: 20 steps, not the example's 60).
    sc.apply_example(CLAIMS, "charlm-elastic.yaml", edit=holding_at(LAST, last=LAST))
    sc.held("charlm", LAST)  # training complete: every rank waits on its own
    ckpt = sc.claim("charlm-checkpoints")
    assert json.loads((ckpt / "complete.json").read_text())["step"] == LAST
    lost = sc.worker_uids("charlm")["charlm-node-1"]
    out = sc.s.kubectl("exec", "charlm-node-1", "-n", sc.ns, "--", "python", "-c", FREEZE,
                       check=False)  # fmt: skip
    frozen = [line for line in out.stdout.splitlines() if not line.startswith("skipped")]
    assert out.returncode == 0 and len(frozen) >= 2, (out.stdout, out.stderr)
    released = time.monotonic()
    sc.release("charlm-checkpoints", LAST)

    def phase(pod: str) -> str:
        return sc.k("get", "pod", pod, "-o", "jsonpath={.status.phase}")

    # node-0's agent waits at torchrun's exit barrier for the frozen peer: 30 s, not 300.
    sc.until("charlm-node-0 Succeeded", lambda: phase("charlm-node-0") == "Succeeded", 90)
    sc.k("delete", "pod", "charlm-node-1", "--wait=false")  # and now the frozen one is lost
    status = sc.phase("charlm", "Succeeded", 60)
    assert time.monotonic() - released < 60
    done = next(c for c in status["conditions"] if c["type"] == "Succeeded")
    assert done["reason"] == "Completed"
    assert done["message"] == "charlm-node-1 was lost after charlm-node-0 completed training"
    assert status["restarts"] == 0 and not status.get("disruptions")
    assert status["progress"]["loss"] is not None  # a finite loss, reported
    assert sc.worker_uids("charlm").get("charlm-node-1", lost) == lost  # not recreated


def test_suspend_keeps_the_checkpoint_and_resume_continues_from_it(sc: Scenario) -> None:
    sc.apply_example(CLAIMS, "digits.yaml", edit=holding_at(25, last=30))
    sc.held("digits", 25)
    sc.k("patch", "ddpjob", "digits", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    sc.until("Suspended", lambda: sc.status("digits").get("phase") == "Suspended")
    sc.until(
        "no pods", lambda: not sc.k("get", "pods", "-l", "ddp.dev/job-name=digits", "-o", "name")
    )
    ckpt = sc.claim("digits-checkpoints")
    kept = json.loads((ckpt / "manifest.json").read_text())["latest"]
    assert kept == "step-00000025.pt" and (ckpt / kept).is_file()  # saved on SIGTERM

    sc.k("patch", "ddpjob", "digits", "--type=merge", "-p", '{"spec":{"suspend":false}}')
    status = sc.phase("digits", "Succeeded", 300)
    assert status["restarts"] == 0  # suspending is no failure
    assert resumed_at(read_run_log(ckpt)) == [25]


def test_an_operator_killed_mid_run_restarts_without_duplicates(sc: Scenario) -> None:
    op = sc.s.operator
    assert op is not None
    sc.apply_example(CLAIMS, "digits.yaml", edit=holding_at(10, last=15))
    sc.held("digits", 10)
    before = sc.worker_uids("digits")
    op.kill()
    time.sleep(2)
    op.start()
    sc.release("digits-checkpoints", 10)
    status = sc.phase("digits", "Succeeded", 300)
    after = sc.worker_uids("digits")
    assert after == before and len(after) == 2  # the same pods: none duplicated or replaced
    assert status["restarts"] == 0


def test_jobs_that_cannot_run_say_why_and_what_cannot_heal_fails(sc: Scenario) -> None:
    """Five broken jobs at once, each a digits job with one thing wrong: they are said apart,
    each by the reason the kubelet, the runtime or the scheduler gave for its own pods. A
    sixth is given the claim of a job that trained before it with another seed: the trainer
    refuses that checkpoint, and the job fails at once with the trainer's words."""
    image = "127.0.0.1:1/ddp-operator/no-such-image:9.9"  # a registry that refuses at once
    small = {"requests": {"cpu": "100m", "memory": "64Mi"}}
    broken: dict[str, dict[str, Any]] = {
        "noimage": {"image": image, "startupDeadlineSeconds": 20, "resources": small},
        "noclaim": {"startupDeadlineSeconds": 20, "resources": small},
        "toobig": {"resources": {"requests": {"cpu": "1000"}}},
        "oom": {"resources": {**small, "limits": {"memory": "64Mi"}}, "backoffLimit": 0},
        "nocmd": {"command": ["/no/such/binary"], "trainer": None, "resources": small},
    }
    examples = [d for d in yaml.safe_load_all((EXAMPLES / "digits.yaml").read_text()) if d]
    jobs = []
    for name, change in broken.items():
        job = copy.deepcopy(examples[0])
        job["metadata"]["name"] = name
        job["spec"].update(nodes=1, **change)
        job["spec"] = {k: v for k, v in job["spec"].items() if v is not None}
        if name == "noclaim":
            job["spec"]["checkpoint"]["volume"]["persistentVolumeClaim"]["claimName"] = "nope"
        jobs.append(job)
    sc.apply_example(CLAIMS)
    sc.k("apply", "-f", "-", input=yaml.safe_dump_all(jobs))
    earlier = copy.deepcopy(examples[0])  # trains 3 steps into a claim of its own
    earlier["metadata"]["name"] = "earlier"
    earlier["spec"].update(nodes=1, resources=small)
    earlier["spec"]["trainer"].update(maxSteps=3, evaluate=False)
    earlier["spec"]["checkpoint"]["volume"]["persistentVolumeClaim"]["claimName"] = SHARED
    sc.k("apply", "-f", "-", input=yaml.safe_dump(earlier))

    def failed(job: str) -> dict[str, Any] | None:
        """The Failed condition, once the job failed (status.reason is its reason)."""
        st = sc.status(job)
        if st.get("phase") != "Failed":
            return None
        cond = next(c for c in st["conditions"] if c["type"] == "Failed")
        assert st["reason"] == cond["reason"]
        return dict(cond)

    def unschedulable() -> str | None:
        """The Pending condition's message once it gives the scheduler's final word: while the
        claim applied just before is still binding (it can take over the operator's 10 s), the
        scheduler first names the claim, and the operator says that."""
        st = sc.status("toobig")
        if st.get("reason") != "Unschedulable":
            return None
        message = next(c for c in st["conditions"] if c["type"] == "Pending")["message"]
        return str(message) if "Insufficient cpu" in message else None

    message = sc.until("toobig Unschedulable: Insufficient cpu", unschedulable, timeout_s=60)
    assert "no machine can take toobig-node-0 yet" in message
    print(sc.k("get", "ddpj"), flush=True)  # what a user sees meanwhile
    sc.k("delete", "ddpjob", "toobig", "--wait=false")  # it would wait for ever (by design)

    sc.phase("earlier", "Succeeded", 180)
    reuse = copy.deepcopy(earlier)  # the same claim, another seed: another run's checkpoint
    reuse["metadata"]["name"] = "reuse"
    reuse["spec"]["trainer"]["seed"] = 7
    sc.k("apply", "-f", "-", input=yaml.safe_dump(reuse))

    nocmd = sc.until("nocmd Failed", lambda: failed("nocmd"), timeout_s=60)
    assert nocmd["reason"] == "CommandNotFound"
    assert "nocmd-node-0 cannot run /no/such/binary" in nocmd["message"]

    oom = sc.until("oom Failed", lambda: failed("oom"), timeout_s=120)
    assert oom["reason"] == "BackoffLimitExceeded"
    # containerd can publish the container's exit before the kernel's OOM event (containerd
    # #12260): the kubelet then says Error, not OOMKilled, and the operator names the limit as
    # the likely cause of the SIGKILL. Either way the user is told which limit to raise.
    said = oom["message"]
    assert said.startswith("oom-node-0 failed (exit code") or said.startswith(
        "oom-node-0 failed with exit code 137 (SIGKILL, as the kernel's OOM killer sends it"
    ), said
    assert (
        "OOMKilled: raise spec.resources.limits.memory (now 64Mi)" in said
        or "spec.resources.limits.memory, now 64Mi; if its memory grew to that, raise it" in said
    ), said

    noimage = sc.until("noimage Failed", lambda: failed("noimage"), timeout_s=90)
    assert noimage["reason"] == "ImagePullFailed"
    # Whichever of its pods' pulls failed first is named: node-0's, or the store's (the
    # kubelet pulls one image at a time, and the two pods may share a machine or not).
    assert noimage["message"].startswith(("noimage-node-0", "the store noimage-rdzv"))
    assert f"cannot pull image {image}: " in noimage["message"]
    assert "startupDeadlineSeconds (20s)" in noimage["message"]

    noclaim = sc.until("noclaim Failed", lambda: failed("noclaim"), timeout_s=90)
    assert noclaim["reason"] == "ClaimNotFound"
    assert (
        "noclaim-node-0 cannot be scheduled: persistentvolumeclaim 'nope'" in (noclaim["message"])
    )
    refused = sc.until("reuse Failed", lambda: failed("reuse"), timeout_s=120)
    assert refused["reason"] == "IncompatibleResume"
    assert refused["message"].startswith(
        f"reuse-node-0 cannot resume from the checkpoint on claim {SHARED}: the settings differ"
        " from the checkpoint's in seed"
    ), refused["message"]
    assert "(seed: the checkpoint's 0, now 7)" in refused["message"]
    assert sc.status("reuse")["restarts"] == 0  # refused at once, not retried
    print(sc.k("get", "ddpj"), flush=True)
    events = sc.k("get", "events", "--field-selector", "involvedObject.kind=DDPJob")
    for reason in (
        "Unschedulable",
        "CommandNotFound",
        "ImagePullFailed",
        "ClaimNotFound",
        "IncompatibleResume",
    ):
        assert reason in events
