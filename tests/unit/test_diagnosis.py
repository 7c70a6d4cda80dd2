"""A job that cannot run says why: pod statuses, as the API shows them, to the job's reason."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from ddpjobs import ddpjob

from ddp_api.ddpjob import DDPJob
from ddp_operator import render
from ddp_operator.planner import draft, views
from ddp_operator.planner.plan import PlanSettings, plan

NOW = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
CFG = render.OperatorConfig(default_image="trainer:test")
RULES = PlanSettings(CFG)
YOUNG = "2026-01-01T11:59:50Z"  # 10 s before NOW
OLD = "2026-01-01T11:50:00Z"  # 600 s before NOW: past the default startupDeadlineSeconds (300)
IMAGE = "ghcr.io/x/y:9.9"
NO_BINARY = (
    "failed to create containerd task: failed to create shim task: OCI runtime create failed:"
    ' runc create failed: unable to start container process: exec: "/no/such/binary": stat'
    " /no/such/binary: no such file or directory: unknown"
)
NO_CLAIM = (
    '0/1 nodes are available: persistentvolumeclaim "ckpt" not found. preemption: 0/1 nodes are'
    " available: 1 Preemption is not helpful for scheduling."
)
NOT_ON_PATH = 'exec: "trainx": executable file not found in $PATH'
NO_MOUNT = "error mounting /ckpt: permission denied"
NO_MATCH = "1 node(s) didn't match Pod's node affinity/selector"
UNBOUND = "pod has unbound immediate PersistentVolumeClaims"
# What the bundled trainer writes as its termination message when the checkpoint folder holds
# another run's state (ddp_trainer.state.compat, through ddp_trainer.launch.exits).
REFUSED = (
    "IncompatibleResume: cannot resume: the settings differ from the checkpoint's in epochs,"
    " which would change the run's meaning (epochs: the checkpoint's 1, now 20). Set epochs back"
    " to the checkpoint's value, or use a new checkpoint folder to start a new run."
)
CLAIMED = {"checkpoint": {"volume": {"persistentVolumeClaim": {"claimName": "ckpt"}}}}


def job(**spec: Any) -> DDPJob:
    return ddpjob({"nodes": 2, **spec})


def body(
    index: int,
    created: str,
    phase: str = "Running",
    state: dict[str, Any] | None = None,
    scheduled: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """A pod as the API returns it: node ``index`` (-1: the store)."""
    store = index < 0
    name = "j-rdzv" if store else render.worker_name("j", index)
    labels = {render.LABEL_ROLE: render.ROLE_STORE if store else render.ROLE_WORKER}
    if not store:
        labels[render.LABEL_INDEX] = str(index)
    status: dict[str, Any] = {"phase": phase}
    if state is not None:
        container = render.STORE_CONTAINER if store else render.CONTAINER
        status["containerStatuses"] = [{"name": container, "image": IMAGE, "state": state}]
    elif scheduled is None:
        status["conditions"] = [{"type": "Ready", "status": "True"}]
    if scheduled is not None:
        reason, message = scheduled
        status["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": reason, "message": message}
        ]
    meta = {"name": name, "uid": f"uid-{name}", "labels": labels, "creationTimestamp": created}
    return {"metadata": meta, "status": status}


def waiting(reason: str, message: str) -> dict[str, Any]:
    return {"waiting": {"reason": reason, "message": message}}


def ended(reason: str, code: int, message: str = "") -> dict[str, Any]:
    return {"terminated": {"reason": reason, "exitCode": code, "message": message}}


# (pod index, phase, state, PodScheduled False, spec) -> (job reason, in its message, outcome):
# fails: Failed at once; deadline: not Failed yet, then Failed once the pod is older than
# startupDeadlineSeconds; waits: never Failed by it; counted: a restart, as for any failure.
CASES = {
    "image cannot be pulled": (
        (0, "Pending", waiting("ErrImagePull", f'failed to pull "{IMAGE}": not found'), None, {}),
        ("ImagePullFailed", f"j-node-0 cannot pull image {IMAGE}: failed to pull", "deadline"),
    ),
    "image pull backing off": (
        (1, "Pending", waiting("ImagePullBackOff", f'Back-off pulling image "{IMAGE}"'), None, {}),
        ("ImagePullFailed", f"j-node-1 cannot pull image {IMAGE}", "deadline"),
    ),
    "image never pulled": (
        (0, "Pending", waiting("ErrImageNeverPull", "imagePullPolicy is Never"), None, {}),
        ("ImagePullFailed", "spec.image", "deadline"),
    ),
    "image name invalid": (
        (0, "Pending", waiting("InvalidImageName", "couldn't parse image name"), None, {}),
        ("ImagePullFailed", "couldn't parse image name", "deadline"),
    ),
    "the store's image cannot be pulled": (
        (-1, "Pending", waiting("ImagePullBackOff", "Back-off"), None, {}),
        ("ImagePullFailed", f"the store j-rdzv cannot pull image {IMAGE}", "deadline"),
    ),
    "claim missing": (
        (0, "Pending", None, ("Unschedulable", NO_CLAIM), {}),
        ("ClaimNotFound", "j-node-0 cannot be scheduled: persistentvolumeclaim 'ckpt'", "deadline"),
    ),
    "secret missing": (
        (0, "Pending", waiting("CreateContainerConfigError", 'secret "s" not found'), None, {}),
        ("ContainerConfigError", "j-node-0 cannot create the container", "deadline"),
    ),
    "container not created": (
        (0, "Pending", waiting("CreateContainerError", "context deadline exceeded"), None, {}),
        ("ContainerConfigError", "CreateContainerError): context deadline exceeded", "deadline"),
    ),
    "command missing, the runtime retrying": (
        (0, "Pending", waiting("RunContainerError", NO_BINARY), None, {}),
        ("CommandNotFound", "j-node-0 cannot run /no/such/binary: failed to create", "fails"),
    ),
    "command missing": (
        (0, "Failed", ended("StartError", 128, NO_BINARY), None, {"command": ["/no/such/binary"]}),
        ("CommandNotFound", "cannot run /no/such/binary", "fails"),
    ),
    "command not on PATH": (
        (1, "Failed", ended("ContainerCannotRun", 128, NOT_ON_PATH), None, {}),
        ("CommandNotFound", "j-node-1 cannot run trainx", "fails"),
    ),
    "a shell's command not found": (
        (0, "Failed", ended("Error", 127), None, {"command": ["sh", "-c", "trainx"]}),
        ("CommandNotFound", "cannot run sh: exit code 127", "fails"),
    ),
    "a shell's not executable": (
        (0, "Failed", ended("Error", 126), None, {}),
        ("CommandNotFound", "cannot run the command (exit code 126)", "fails"),
    ),
    "out of memory, limit unset": (
        (0, "Failed", ended("OOMKilled", 137), None, {}),
        (
            "OOMKilled",
            "j-node-0 failed (exit code 137): OOMKilled: raise spec.resources.limits"
            ".memory (now unset)",
            "counted",
        ),
    ),
    "out of memory": (
        (1, "Failed", ended("OOMKilled", 1), None, {"resources": {"limits": {"memory": "64Mi"}}}),
        (
            "OOMKilled",
            "j-node-1 failed (exit code 1): OOMKilled: raise spec.resources.limits.memory"
            " (now 64Mi)",
            "counted",
        ),
    ),
    "runtime could not start it otherwise": (
        (0, "Failed", ended("StartError", 128, "cgroup: device busy"), None, {}),
        ("StartError", "j-node-0 could not start (exit code 128): StartError: cgroup", "counted"),
    ),
    "runtime could not mount": (
        (0, "Failed", ended("StartError", 128, NO_MOUNT), None, {}),
        ("StartError", "could not start (exit code 128): StartError: error mounting", "counted"),
    ),
    "the trainer refuses another run's checkpoint": (
        (1, "Failed", ended("Error", 1, REFUSED), None, CLAIMED),
        (
            "IncompatibleResume",
            "j-node-1 cannot resume from the checkpoint on claim ckpt: the settings differ from"
            " the checkpoint's in epochs, which would change the run's meaning (epochs: the"
            " checkpoint's 1, now 20).",
            "fails",
        ),
    ),
    "the program does not compile (the node wrapper read its SyntaxError)": (
        (
            0,
            "Failed",
            ended("Error", 1, "SyntaxError: expected ':' (/scripts/t.py, line 2)"),
            None,
            {"command": ["python", "-m", "ddp_trainer.node"], "args": ["/scripts/t.py"]},
        ),
        (
            "SyntaxError",
            "j-node-0 cannot run the program: it does not compile: SyntaxError: expected ':'"
            " (/scripts/t.py, line 2); fix it and run the job again (no restart can)",
            "fails",
        ),
    ),
    "no machine has the cpu": (
        (0, "Pending", None, ("Unschedulable", "0/3 nodes are available: 3 Insufficient cpu."), {}),
        (
            "Unschedulable",
            "no machine can take j-node-0 yet (Unschedulable): 0/3 nodes are"
            " available: 3 Insufficient cpu.; waiting",
            "waits",
        ),
    ),
    "a taint": (
        (1, "Pending", None, ("Unschedulable", "1 node(s) had untolerated taint {gpu: }"), {}),
        ("Unschedulable", "untolerated taint", "waits"),
    ),
    "a node selector": (
        (0, "Pending", None, ("Unschedulable", NO_MATCH), {}),
        ("Unschedulable", "spec.template.nodeSelector", "waits"),
    ),
    "a claim not bound yet": (
        (0, "Pending", None, ("Unschedulable", UNBOUND), {}),
        ("Unschedulable", "unbound immediate PersistentVolumeClaims", "waits"),
    ),
}


def observe(pod: dict[str, Any], spec: dict[str, Any], created: str) -> draft.Plan:
    """The job with node 0, node 1 and the store, one of them replaced by ``pod``."""
    pod["metadata"]["creationTimestamp"] = created
    shown = views.view(pod)
    others = [views.view(body(i, created)) for i in (-1, 0, 1) if i != shown.index]
    status = {"phase": "Pending", "startTime": OLD}
    return plan(job(**spec), status, [*others, shown], NOW, RULES)


def said(p: draft.Plan) -> tuple[str, str, str]:
    """(phase, reason, message) of the job's current condition, and status.reason agrees."""
    phase = p.status["phase"]
    cond = next(c for c in p.status["conditions"] if c["type"] == phase)
    assert cond["status"] == "True" and p.status["reason"] == cond["reason"]
    return phase, cond["reason"], cond["message"]


@pytest.mark.parametrize(("pod", "expected"), list(CASES.values()), ids=list(CASES))
def test_a_pods_problem_becomes_the_jobs_reason_and_outcome(
    pod: tuple[int, str, dict[str, Any] | None, tuple[str, str] | None, dict[str, Any]],
    expected: tuple[str, str, str],
) -> None:
    index, phase, state, scheduled, spec = pod
    reason, named, outcome = expected
    young = observe(body(index, YOUNG, phase, state, scheduled), spec, YOUNG)
    old = observe(body(index, OLD, phase, state, scheduled), spec, OLD)
    if outcome == "fails":
        for p in (young, old):
            assert said(p)[:2] == ("Failed", reason)
            assert named in said(p)[2]
            assert p.status["restarts"] == 0
        return
    if outcome == "counted":
        assert said(young)[:2] == ("Restarting", reason) and named in said(young)[2]
        assert young.status["restarts"] == 1
        assert [r for _, r, m in young.events if named in m] == ["PodFailed"]
        return
    phase_young, reason_young, message_young = said(young)
    assert phase_young != "Failed" and reason_young == reason
    assert named in message_young
    assert (reason, message_young) in [(r, m) for t, r, m in young.events if t == "Warning"]
    if outcome == "waits":
        assert said(old) == said(young)  # it may heal: waits, however long
        assert young.requeue_after is None
    else:
        assert "startupDeadlineSeconds" in message_young
        assert young.requeue_after == pytest.approx(290)
        assert said(old)[:2] == ("Failed", reason) and named in said(old)[2]
        assert set(old.delete) == {"j-rdzv", "j-node-0", "j-node-1"}  # the finish path


KILLED_HINT = (
    "failed with exit code 137 (SIGKILL, as the kernel's OOM killer sends it when a container"
    " passes spec.resources.limits.memory, now 64Mi; if its memory grew to that, raise it)"
)


@pytest.mark.parametrize("backoff", [0, 3])
def test_a_kill_the_runtime_did_not_call_oomkilled_names_the_memory_limit(backoff: int) -> None:
    """containerd can publish a container's exit before the kernel's OOM event (containerd
    #12260), and the kubelet then says Error with exit code 137: the memory limit is named as
    the likely cause (with a limit only), not as a diagnosis."""
    spec = {"backoffLimit": backoff, "resources": {"limits": {"memory": "64Mi"}}}
    p = observe(body(0, YOUNG, "Failed", ended("Error", 137)), spec, YOUNG)
    [(kind, reason, text)] = [e for e in p.events if "j-node-0" in e[2]]
    assert kind == "Warning" and text.startswith(f"j-node-0 {KILLED_HINT}")
    if backoff:
        assert reason == "PodFailed" and said(p)[:2] == ("Restarting", "PodFailed")
    else:
        assert said(p) == (
            "Failed",
            "BackoffLimitExceeded",
            f"j-node-0 {KILLED_HINT}; the job already used its backoffLimit of 0 restarts",
        )
    for code, limits in ((137, {}), (1, {"limits": {"memory": "64Mi"}})):
        spec = {"backoffLimit": 0, "resources": limits}
        p = observe(body(1, YOUNG, "Failed", ended("Error", code)), spec, YOUNG)
        assert said(p)[2] == (
            f"j-node-1 failed with exit code {code}; the job already used its backoffLimit of 0"
            " restarts"
        )


def test_pods_with_one_problem_are_named_together_and_it_is_said_once() -> None:
    pods = [
        views.view(body(1, YOUNG, "Pending", waiting("ErrImagePull", "not found"))),
        views.view(body(-1, YOUNG, "Pending", waiting("ImagePullBackOff", "Back-off"))),
        views.view(body(0, YOUNG, "Pending", waiting("ImagePullBackOff", "Back-off"))),
    ]
    assert len({*pods, *pods}) == 3  # views are hashable and compared by value (the cache)
    first = plan(job(), {"startTime": YOUNG}, pods, NOW, RULES)
    _, reason, message = said(first)
    assert reason == "ImagePullFailed"
    assert message.startswith(f"j-node-0, j-node-1 and the store j-rdzv cannot pull image {IMAGE}")
    assert [r for t, r, _ in first.events if t == "Warning"] == ["ImagePullFailed"]
    again = plan(job(), first.status, pods, NOW, RULES)
    assert said(again)[1] == "ImagePullFailed"
    assert [r for t, r, _ in again.events if t == "Warning"] == []  # not every reconcile


def test_an_oom_kill_stays_named_until_the_job_is_running_again() -> None:
    oom = views.view(body(0, YOUNG, "Failed", ended("OOMKilled", 137)))
    running = [views.view(body(i, YOUNG)) for i in (-1, 1)]
    first = plan(job(), {"startTime": YOUNG}, [*running, oom], NOW, RULES)
    assert said(first)[:2] == ("Restarting", "OOMKilled") and first.delete == ["j-node-0"]
    later = NOW + dt.timedelta(seconds=5)
    status = {**first.status, "phase": "Restarting"}
    second = plan(job(), status, running, later, RULES)  # j-node-0 gone, recreated
    assert said(second) == said(first)
    assert [r for t, r, _ in second.events if t == "Warning"] == []
    back = [*running, views.view(body(0, YOUNG))]
    assert said(plan(job(), second.status, back, later, RULES))[:2] == (
        "Running",
        "AllNodesRunning",
    )


def test_a_pod_is_called_unschedulable_only_after_a_moment() -> None:
    # A claim made by the same `kubectl apply` is unbound for a moment; the scheduler says so.
    unbound = ("Unschedulable", "0/1 nodes are available: pod has unbound immediate claims")
    moment = views.view(body(0, "2026-01-01T11:59:58Z", "Pending", scheduled=unbound))
    store = views.view(body(-1, YOUNG))
    p = plan(job(nodes=1), {"startTime": YOUNG}, [store, moment], NOW, RULES)
    assert said(p) == ("Pending", "WaitingForNodes", "starting 1 nodes") and not p.events
    assert p.requeue_after == pytest.approx(8)  # when it may be said
    later = NOW + dt.timedelta(seconds=8)
    p = plan(job(nodes=1), p.status, [store, moment], later, RULES)
    assert said(p)[1] == "Unschedulable" and [r for _, r, _ in p.events] == ["Unschedulable"]


def test_a_failed_workers_own_words_are_quoted_with_its_failure() -> None:
    """A worker's termination message (why it failed, in the trainer's or the script's words)
    is quoted in the failure's Event and condition, one line, bounded; not for an end by a
    signal (128+), where the file may hold an earlier failure's words."""
    words = "ValueError: the corpus\n  has no text"
    p = observe(body(0, YOUNG, "Failed", ended("Error", 1, words)), {}, YOUNG)
    expected = "j-node-0 failed with exit code 1: ValueError: the corpus has no text"
    assert said(p) == ("Restarting", "PodFailed", f"{expected}; restart 1 of backoffLimit 3")
    assert [r for _, r, m in p.events if m.startswith(f"{expected}; recreating")] == ["PodFailed"]
    p = observe(body(0, YOUNG, "Failed", ended("Error", 2, "x" * 5000)), {"backoffLimit": 0}, YOUNG)
    quoted = said(p)[2].removeprefix("j-node-0 failed with exit code 2: ")
    assert quoted.startswith("x" * 100) and quoted.index("...;") == 509  # 512 with the dots
    for code in (137, 143):
        p = observe(body(0, YOUNG, "Failed", ended("Error", code, words)), {}, YOUNG)
        assert said(p)[2] == "restart 1 of backoffLimit 3"
        assert [m for _, _, m in p.events if "ValueError" in m] == []
    # A refusal's kind is read only from a failed container's message.
    assert views.view(body(0, YOUNG, "Succeeded", ended("Completed", 0, REFUSED))).problem is None


def test_a_workers_words_stay_in_the_restarting_condition_until_the_job_runs_again() -> None:
    """Seen on kind: the words were in the condition only until the next reconcile, which
    said the bare count again; what the user reads while the job restarts is why."""
    failed = views.view(body(0, YOUNG, "Failed", ended("Error", 1, "ValueError: no text")))
    store = views.view(body(-1, YOUNG))
    first = plan(job(nodes=1), {"startTime": YOUNG}, [store, failed], NOW, RULES)
    expected = "j-node-0 failed with exit code 1: ValueError: no text; restart 1 of backoffLimit 3"
    assert said(first) == ("Restarting", "PodFailed", expected)
    later = NOW + dt.timedelta(seconds=5)
    status = {**first.status, "phase": "Restarting"}
    second = plan(job(nodes=1), status, [store], later, RULES)  # j-node-0 gone, recreated
    assert said(second) == said(first)
    starting = [store, views.view(body(0, YOUNG, "Pending"))]
    assert said(plan(job(nodes=1), second.status, starting, later, RULES)) == said(first)
    back = [store, views.view(body(0, YOUNG))]
    assert said(plan(job(nodes=1), second.status, back, later, RULES))[:2] == (
        "Running",
        "AllNodesRunning",
    )
    wordless = [store, views.view(body(0, YOUNG, "Failed"))]
    bare = plan(job(nodes=1), {"startTime": YOUNG}, wordless, NOW, RULES)
    assert said(bare)[2] == "restart 1 of backoffLimit 3"
    bare_later = plan(job(nodes=1), {**bare.status, "phase": "Restarting"}, [store], later, RULES)
    assert said(bare_later)[2].startswith("restart 1 of backoffLimit 3")  # said afresh


NO_PYTHON3 = 'exec: "python3": executable file not found in $PATH'
NO_LIGHTHOUSE = 'exec: "torchft_lighthouse": executable file not found in $PATH'


@pytest.mark.parametrize(
    ("role", "mode", "said_of_it"),
    [
        (
            render.ROLE_STORE,
            "Restart",
            "the store j-rdzv cannot run python3: failed to create containerd task: exec:"
            ' "python3": executable file not found in $PATH; it runs python3 with torch (the'
            " rendezvous store) from the job's image: use a spec.image that has it",
        ),
        (
            render.ROLE_LIGHTHOUSE,
            "PerStep",
            "the lighthouse j-lighthouse cannot run torchft_lighthouse: failed to create"
            ' containerd task: exec: "torchft_lighthouse": executable file not found in $PATH;'
            " it runs torchft_lighthouse (pip install torchft) from the job's image",
        ),
    ],
)
def test_a_server_pod_whose_image_lacks_its_program_fails_the_job_naming_the_image(
    role: str, mode: str, said_of_it: str
) -> None:
    # Seen on kind: a PerStep job of an image without torchft sat Running with 3/3 groups
    # ready while its lighthouse crash-looped on StartError, which no one read.
    name, container, missing = {
        render.ROLE_STORE: ("j-rdzv", render.STORE_CONTAINER, NO_PYTHON3),
        render.ROLE_LIGHTHOUSE: ("j-lighthouse", render.LIGHTHOUSE_CONTAINER, NO_LIGHTHOUSE),
    }[role]
    last = ended("StartError", 128, f"failed to create containerd task: {missing}")
    server = {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "labels": {render.LABEL_ROLE: role},
            "creationTimestamp": YOUNG,
        },
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": container,
                    "image": IMAGE,
                    "state": waiting("CrashLoopBackOff", "back-off 10s restarting"),
                    "lastState": last,
                }
            ],
        },
    }
    spec: dict[str, Any] = {"image": IMAGE}
    if mode == "PerStep":
        spec["faultTolerance"] = {"mode": "PerStep"}
    nodes = [views.view(body(i, YOUNG)) for i in (0, 1)]
    p = plan(
        job(**spec),
        {"phase": "Running", "startTime": OLD},
        [*nodes, views.view(server)],
        NOW,
        RULES,
    )
    phase, reason, message = said(p)
    assert (phase, reason) == ("Failed", "CommandNotFound")
    assert said_of_it in message


def test_a_server_that_keeps_exiting_is_said_with_its_last_words_and_fails_nothing() -> None:
    # An image whose python3 has no torch: the store exits 1 again and again, the kubelet
    # backs off, and the nodes would wait for a rendezvous; the job says so, naming the fix,
    # and fails nothing by itself (a store that crashed once mid-run comes back).
    tail = "Traceback (most recent call last):\nModuleNotFoundError: No module named 'torch'\n"

    def store(
        restarts: int, ready: bool, state: dict[str, Any], last: dict[str, Any] | None = None
    ) -> views.PodView:
        container = {
            "name": render.STORE_CONTAINER,
            "image": IMAGE,
            "restartCount": restarts,
            "ready": ready,
            "state": state,
            "lastState": {"terminated": last} if last else ended("Error", 1, tail),
        }
        meta = {
            "name": "j-rdzv",
            "uid": "uid-j-rdzv",
            "labels": {render.LABEL_ROLE: render.ROLE_STORE},
            "creationTimestamp": OLD,
        }
        return views.view(
            {"metadata": meta, "status": {"phase": "Running", "containerStatuses": [container]}}
        )

    nodes = [views.view(body(i, OLD)) for i in (0, 1)]
    status = {"phase": "Running", "startTime": OLD}

    def seen(server: views.PodView, before: dict[str, Any]) -> draft.Plan:
        return plan(job(image=IMAGE), before, [*nodes, server], NOW, RULES)

    backing_off = seen(store(2, False, waiting("CrashLoopBackOff", "back-off 40s")), status)
    assert said(backing_off) == (
        "Running",
        "ServerFailing",
        "the store j-rdzv keeps failing (exit code 1: ModuleNotFoundError: No module named"
        " 'torch'), restarted with a back-off; it runs python3 with torch (the rendezvous store)"
        " from the job's image: check that spec.image has it (kubectl logs j-rdzv --previous)",
    )
    assert [r for t, r, _ in backing_off.events if t == "Warning"] == ["ServerFailing"]
    assert backing_off.requeue_after is None  # it waits for the store; nothing to fail
    # Its state flips between back-off, ended and a moment's run (seen on kind): the same
    # problem, said once.
    shown = {**status, **backing_off.status}
    for state in (ended("Error", 1, tail), {"running": {}}):
        again = seen(store(3, False, state), shown)
        assert said(again) == said(backing_off) and again.events == []
    assert said(seen(store(3, True, {"running": {}}), shown))[1] != "ServerFailing"  # back
    once = seen(store(1, False, waiting("CrashLoopBackOff", "back-off 10s")), status)
    assert said(once)[1] != "ServerFailing"  # one crash mid-run is not yet said
    # A third crash after hours of running: the store is starting again, not looping.
    crash = ended("Error", 1, tail)["terminated"]
    hours = {**crash, "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T03:00:00Z"}
    for state in (waiting("CrashLoopBackOff", "back-off 10s"), {"running": {}}):
        assert said(seen(store(3, False, state, hours), status))[1] != "ServerFailing"
    assert said(seen(store(3, False, {"terminated": hours}), status))[1] != "ServerFailing"
    minute = {**hours, "finishedAt": "2026-01-01T00:01:00Z"}  # a loop whose runs are longer
    assert said(seen(store(3, False, {"running": {}}, minute), status))[1] == "ServerFailing"
