"""``kubectl ddp`` (the installed plugin) and ``ddp_client.client`` against a real API server
and the operator, with kwok playing the pods (``kwok.ddp.dev/exit-code`` ends them). kwok's
nodes serve no pods/log: merged logs and plots of real runs are in
tests/e2e/test_kubectl_ddp_e2e.py."""

from __future__ import annotations

import json
import queue
import re
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from ddp_client import DDPClient, JobNotFound, WaitTimeout
from ddp_devcluster.operator_process import OperatorProcess
from ddp_devcluster.plane import ControlPlane
from ddp_devcluster.polling import until
from ddp_operator.render import LABEL_JOB
from kubectl_plugin import KubectlDdp

pytestmark = pytest.mark.controlplane
EXIT = "kwok.ddp.dev/exit-code"
SCRIPT = 'import os\nprint("hello from rank", os.environ["RANK"])\n'


class Namespace:
    """A fresh namespace (restricted Pod Security: the client's pods must pass it too), with
    kubectl, ``kubectl ddp`` and the Python client in it."""

    def __init__(self, cp: ControlPlane, op: OperatorProcess, plugin: KubectlDdp):
        self.cp, self.op = cp, op
        self.name = f"c-{uuid.uuid4().hex[:8]}"
        cp.kubectl("create", "namespace", self.name)
        cp.kubectl("label", "namespace", self.name, "pod-security.kubernetes.io/enforce=restricted")
        self.plugin = KubectlDdp(plugin.bin_dir, cp.kubeconfig)
        self.client = DDPClient(self.name, kubeconfig=str(cp.kubeconfig))

    def k(self, *args: str) -> str:
        return str(self.cp.kubectl(*args, "-n", self.name).stdout)

    def get(self, kind: str, name: str) -> dict[str, Any]:
        return dict(json.loads(self.k("get", kind, name, "-o", "json")))

    def ddp(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        command, *rest = args  # -n before a `--` that ends the options
        return self.plugin(command, "-n", self.name, *rest, **kw)

    def workers(self, job: str, count: int) -> list[dict[str, Any]]:
        def probe() -> list[dict[str, Any]] | None:
            out = json.loads(self.k("get", "pods", "-l", f"{LABEL_JOB}={job}", "-o", "json"))
            pods = [p for p in out["items"] if p["metadata"]["name"].startswith(f"{job}-node-")]
            running = [p for p in pods if p["status"].get("phase") == "Running"]
            return running if len(running) == count else None

        return until(f"{count} running pods of {job}", probe, 60, detail=lambda: self.op.tail(15))

    def end(self, job: str, count: int, code: int) -> None:
        for pod in self.workers(job, count):
            self.k("annotate", "pod", pod["metadata"]["name"], f"{EXIT}={code}")


@pytest.fixture
def ns(
    control_plane: ControlPlane, operator: OperatorProcess, kubectl_ddp: KubectlDdp
) -> Namespace:
    return Namespace(control_plane, operator, kubectl_ddp)


def test_kubectl_finds_the_installed_plugin(ns: Namespace) -> None:
    plugins = subprocess.run(
        [*ns.plugin.argv()[:1], "plugin", "list"],
        env=ns.plugin.env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert str(ns.plugin.bin_dir / "kubectl-ddp") in plugins.stdout, plugins.stdout
    usage = ns.plugin("--help")
    assert usage.returncode == 0 and "submit" in usage.stdout and "plot" in usage.stdout


def test_submit_makes_a_configmap_and_a_ddpjob_that_the_operator_runs(
    ns: Namespace, tmp_path: Path
) -> None:
    script = tmp_path / "Train_v2.py"
    script.write_text(SCRIPT)
    out = ns.ddp("submit", str(script), "--nodes", "2", "--nproc", "2", "--", "--epochs", "1")
    assert out.returncode == 0, out.stderr
    name = out.stdout.strip()
    assert name.startswith("train-v2-") and len(name) == len("train-v2-") + 5
    assert f"kubectl ddp watch {name}" in out.stderr

    job = ns.get("ddpjob", name)
    cm = ns.get("configmap", name)
    assert cm["data"] == {"Train_v2.py": SCRIPT}
    assert cm["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert job["spec"]["command"] == ["python", "-m", "ddp_trainer.node"]
    assert job["spec"]["args"] == ["/scripts/Train_v2.py", "--epochs", "1"]

    pods = ns.workers(name, 2)
    container = pods[0]["spec"]["containers"][0]
    assert container["image"] == "trainer:test"  # the operator's default image
    assert container["args"] == ["/scripts/Train_v2.py", "--epochs", "1"]
    assert {"name": "script", "mountPath": "/scripts", "readOnly": True} in container[
        "volumeMounts"
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PET_NPROC_PER_NODE"] == "2" and env["PET_TEE"] == "3"

    ns.k("delete", "ddpjob", name, "--wait=true")  # the ConfigMap goes with the job
    until(
        f"configmap {name} deleted",
        lambda: name not in ns.k("get", "configmaps", "-o", "name"),
        60,
    )


def progress(step: int, loss: float) -> str:
    report = {"epoch": step // 5, "step": step, "totalSteps": 10, "loss": loss}
    return json.dumps(
        {"status": {"progress": {**report, "samplesPerSecond": 99.5, "worldSize": 4}}}
    )


class Lines:
    """The stdout of a command running in the background, a line at a time."""

    def __init__(self, proc: subprocess.Popen[str]):
        self.proc, self.lines = proc, queue.Queue[str]()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def next(self, timeout_s: float = 60) -> str:
        return self.lines.get(timeout=timeout_s)

    def rest(self, timeout_s: float = 60) -> tuple[int, list[str], str]:
        """Exit code, the lines not read yet and stderr, once the command has ended."""
        self.proc.wait(timeout_s)
        assert self.proc.stderr is not None
        time.sleep(0.1)  # the reader thread takes the last lines
        return self.proc.returncode, list(self.lines.queue), self.proc.stderr.read()


def test_watch_shows_progress_and_phases_and_exits_0_on_succeeded(
    ns: Namespace, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    name = ns.ddp("submit", str(script), "--nodes", "2").stdout.strip()
    first, second = (p["metadata"]["name"] for p in ns.workers(name, 2))
    watch = Lines(ns.plugin.start("watch", name, "-n", ns.name))
    assert watch.next() == "phase Running: 2 nodes running"
    for step, loss in ((5, 1.25), (10, 0.5)):  # as the operator writes rank 0's reports
        patch = progress(step, loss)
        ns.k("patch", "ddpjob", name, "--subresource=status", "--type=merge", "-p", patch)
        line = watch.next()
        assert line.startswith(f"[{'#' * (3 * step)}{'-' * (30 - 3 * step)}] epoch {step // 5}")
        assert f"step {step}/10 loss {loss:.4f}    100 samples/s (world size 4)" in line
    # One node ends first: the job stays Running with a reason line of its own, naming the one
    # that finished and the one waited for (ended one at a time: both at once, the operator may
    # see them together or not).
    ns.k("annotate", "pod", first, f"{EXIT}=0")
    line = watch.next()
    assert re.fullmatch(
        rf"reason NodesCompleting: {first} completed training; "
        rf"waiting up to \d+s more for {second}",
        line,
    ), line
    ns.k("annotate", "pod", second, f"{EXIT}=0")
    code, rest, err = watch.rest()
    assert code == 0, err
    assert rest[0] == "phase Succeeded: all 2 nodes exited 0"
    assert rest[1].startswith(f"ddpjob {name} Succeeded in ") and len(rest) == 2


def test_watch_exits_1_when_the_job_fails_and_the_client_waits_with_a_timeout(
    ns: Namespace,
) -> None:
    spec = {"nodes": 1, "restartPolicy": "Never", "trainer": {"workload": "digits"}}
    name = ns.client.create_job({"metadata": {"generateName": "fails-"}, "spec": spec})
    assert name.startswith("fails-")
    with pytest.raises(WaitTimeout, match=f"ddpjob {name} is still"):
        ns.client.wait(name, timeout_s=1, poll_s=0.2)
    assert ns.client.progress(name) is None  # nothing reported yet
    watch = ns.plugin.start("watch", name, "-n", ns.name)
    ns.end(name, 1, 1)
    out, err = watch.communicate(timeout=60)
    assert watch.returncode == 1, (out, err)
    assert "phase Failed" in out and out.splitlines()[-1].startswith(f"ddpjob {name} Failed")
    assert out.splitlines()[-1].endswith(": PodFailed")  # the reason, as status.reason says
    assert ns.client.wait(name, timeout_s=5).phase == "Failed"


def test_a_missing_job_is_one_line_and_exit_code_2(ns: Namespace) -> None:
    for command in (["watch", "nope"], ["logs", "nope"], ["plot", "nope", "-o", "x.png"]):
        out = ns.ddp(*command)
        assert out.returncode == 2 and out.stdout == ""
        assert out.stderr == f'kubectl ddp: ddpjob "nope" not found in namespace "{ns.name}"\n'
    with pytest.raises(JobNotFound):
        ns.client.status("nope")


def test_an_unreachable_cluster_or_a_missing_script_is_one_line_and_exit_code_2(
    ns: Namespace, tmp_path: Path
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ns.cp.server
    closed = tmp_path / "closed.kubeconfig"
    closed.write_text(ns.cp.kubeconfig.read_text().replace(server, f"https://127.0.0.1:{port}"))
    out = ns.plugin("watch", "any", kubeconfig=closed)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith(
        f"kubectl ddp: cannot reach the cluster at https://127.0.0.1:{port}"
    )
    assert len(out.stderr.splitlines()) == 1

    out = ns.ddp("submit", str(tmp_path / "absent.py"))
    assert out.returncode == 2
    assert out.stderr == f"kubectl ddp: no such script: {tmp_path / 'absent.py'}\n"


def test_plot_reads_metrics_through_a_restricted_pod_that_it_deletes(ns: Namespace) -> None:
    spec = {"nodes": 1, "trainer": {"workload": "digits"}, "image": "mine:1"}
    plain = ns.client.create_job({"metadata": {"name": "plain"}, "spec": spec})
    out = ns.ddp("plot", plain, "-o", "x.png")
    assert out.returncode == 2
    assert out.stderr == (
        "kubectl ddp: ddpjob plain has no checkpoint volume (spec.checkpoint), so it keeps no"
        " metrics.jsonl to read\n"
    )

    spec = {**spec, "checkpoint": {"volume": {"emptyDir": {}}, "path": "/ckpt"}}
    name = ns.client.create_job({"metadata": {"name": "kept"}, "spec": spec})
    plot = ns.plugin.start("plot", name, "-o", "x.png", "-n", ns.name, "--timeout", "60")
    container = reader_container(ns, "kept-plot-")
    assert container["command"] == ["cat", "/ckpt/metrics.jsonl"]
    reader_ends_and_goes(ns, plot)


def test_logs_from_the_volume_go_through_a_restricted_pod_that_it_deletes(ns: Namespace) -> None:
    spec = {"nodes": 1, "trainer": {"workload": "digits"}, "image": "mine:1"}
    plain = ns.client.create_job({"metadata": {"name": "plain"}, "spec": spec})
    out = ns.ddp("logs", plain, "--from-volume")
    assert out.returncode == 2
    assert out.stderr == (
        "kubectl ddp: ddpjob plain has no checkpoint volume (spec.checkpoint), so it keeps no"
        " logs to read\n"
    )
    out = ns.ddp("logs", plain, "--from-volume", "-f")
    assert out.returncode == 2 and "--follow streams the pods' logs" in out.stderr

    spec = {**spec, "checkpoint": {"volume": {"emptyDir": {}}, "path": "/ckpt"}}
    name = ns.client.create_job({"metadata": {"name": "kept"}, "spec": spec})
    ns.workers(name, 1)  # its pods run: only --from-volume reads the volume
    logs = ns.plugin.start("logs", name, "--from-volume", "-n", ns.name, "--timeout", "60")
    container = reader_container(ns, "kept-logs-")
    assert container["command"][:2] == ["python", "-c"]
    assert container["command"][3:] == ["/ckpt/logs", "kept-node-", str(8 * 2**20)]
    assert container["volumeMounts"][0]["readOnly"] is True
    reader_ends_and_goes(ns, logs)


def reader_pod(ns: Namespace) -> dict[str, Any] | None:
    """The short-lived pod that `plot` or `logs --from-volume` made, if any."""
    pods = json.loads(ns.k("get", "pods", "-l", "app.kubernetes.io/managed-by", "-o", "json"))
    return next(iter(pods["items"]), None)


def reader_container(ns: Namespace, prefix: str) -> dict[str, Any]:
    """The reader pod's container, once the pod shows up: owned by job ``kept``, not one of its
    pods (no job label), running the job's image."""
    pod = until("the reader pod", lambda: reader_pod(ns), 30)
    assert pod["metadata"]["name"].startswith(prefix)
    assert LABEL_JOB not in pod["metadata"]["labels"]
    assert pod["metadata"]["ownerReferences"][0]["name"] == "kept"
    container: dict[str, Any] = pod["spec"]["containers"][0]
    assert container["image"] == "mine:1"
    return container


def reader_ends_and_goes(ns: Namespace, command: subprocess.Popen[str]) -> None:
    """kwok ends the reader pod; ``command`` fails naming it (kwok serves no logs) and
    deletes it."""
    pod = reader_pod(ns)
    assert pod is not None
    ns.k("annotate", "pod", pod["metadata"]["name"], f"{EXIT}=0")
    _, err = command.communicate(timeout=60)
    # kwok serves no logs: the error names the pod whose log could not be read.
    assert command.returncode == 2 and err.startswith(
        f"kubectl ddp: cannot read the log of pod {pod['metadata']['name']}: "
    )
    until("the reader pod deleted", lambda: reader_pod(ns) is None, 30)
