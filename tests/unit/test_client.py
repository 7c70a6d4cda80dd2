"""The client's pure parts and its command line without a cluster: the objects `kubectl ddp`
creates, the curves it draws, and the one-line errors it gives."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from ddp_client import cli, draw_curves, jobs, status_of
from ddp_client import objects as client_objects
from ddp_client.curves import Curves
from ddp_client.objects import (
    InvalidJob,
    ScriptOptions,
    job_name,
    metrics_reader_pod,
    reader_image,
    script_key,
    script_objects,
)
from ddp_client.pod_state import image_trouble
from ddp_operator.render import LABEL_JOB, OperatorConfig

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_a_job_is_named_after_its_script_as_a_dns_label_of_at_most_50() -> None:
    assert job_name("Train_v2.py", "ab1c2") == "train-v2-ab1c2"
    assert job_name("/home/me/experiments/run.py", "ab1c2") == "run-ab1c2"
    assert job_name("123.py", "ab1c2") == "job-123-ab1c2"
    assert job_name("___.py", "ab1c2") == "job-ab1c2"
    long = job_name("a" * 80 + ".py", "ab1c2")
    assert len(long) == 50 and long.endswith("-ab1c2")
    assert script_key("dir/my_train.py") == "my_train.py"
    assert script_key("my train.py") == "train.py"


def test_a_script_becomes_a_configmap_and_a_ddpjob_running_it_under_torchrun() -> None:
    """In the trainer image torchrun is started by its node wrapper (it outlives a replaced
    store and says why a worker failed); in an image of the user's, plain torchrun."""
    options = ScriptOptions(nodes=2, nproc_per_node=4, checkpoint_claim="ckpt", args=("--lr", "1"))
    cm, job = script_objects("exp/train.py", "print('hi')\n", options, "team", "x1y2z")
    assert cm["metadata"] == {
        "name": "train-x1y2z",
        "namespace": "team",
        "labels": client_objects.MANAGED_BY,
    }
    assert cm["data"] == {"train.py": "print('hi')\n"}
    assert job["apiVersion"] == "ddp.dev/v1alpha1" and job["kind"] == "DDPJob"
    assert job["metadata"]["name"] == "train-x1y2z"
    spec = job["spec"]
    assert spec["nodes"] == 2 and spec["nprocPerNode"] == 4
    assert spec["command"] == ["python", "-m", "ddp_trainer.node"]
    assert spec["args"] == ["/scripts/train.py", "--lr", "1"]
    assert spec["template"]["volumes"] == [{"name": "script", "configMap": {"name": "train-x1y2z"}}]
    assert spec["template"]["volumeMounts"] == [
        {"name": "script", "mountPath": "/scripts", "readOnly": True}
    ]
    assert spec["checkpoint"] == {"volume": {"persistentVolumeClaim": {"claimName": "ckpt"}}}
    assert "image" not in spec and "minNodes" not in spec  # the operator's default image

    _, elastic = script_objects("t.py", "", ScriptOptions(min_nodes=1, max_nodes=3), "ns", "a")
    assert (elastic["spec"]["nodes"], elastic["spec"]["minNodes"]) == (3, 1)
    _, named = script_objects("t.py", "", ScriptOptions(name="mine", image="img:1"), "ns", "a")
    assert named["metadata"]["name"] == "mine" and named["spec"]["image"] == "img:1"
    assert "checkpoint" not in named["spec"]
    assert named["spec"]["command"] == ["torchrun"]  # an image that may not have the wrapper
    for launcher, image, command in [
        ("node", "img:1", ["python", "-m", "ddp_trainer.node"]),  # an image built on ours
        ("torchrun", None, ["torchrun"]),
    ]:
        options = ScriptOptions(launcher=launcher, image=image)
        _, chosen = script_objects("t.py", "", options, "ns", "a")
        assert chosen["spec"]["command"] == command
        assert chosen["spec"]["args"] == ["/scripts/t.py"]


def test_a_script_may_run_per_step_with_its_knobs() -> None:
    options = ScriptOptions(nodes=3, fault_tolerance="PerStep", min_groups=2, group_timeout_s=10)
    _, job = script_objects("ft.py", "", options, "ns", "a")
    assert job["spec"]["faultTolerance"] == {
        "mode": "PerStep",
        "minGroups": 2,
        "groupTimeoutSeconds": 10,
    }
    _, plain = script_objects("t.py", "", ScriptOptions(), "ns", "a")
    assert "faultTolerance" not in plain["spec"]  # the API's default, Restart


def test_options_the_api_would_refuse_are_refused_first_naming_the_field() -> None:
    with pytest.raises(InvalidJob, match=r"spec.minNodes \(3\) must not exceed spec.maxNodes"):
        script_objects("t.py", "", ScriptOptions(min_nodes=3, max_nodes=2), "ns", "a")
    with pytest.raises(InvalidJob, match=r"spec\.minNodes and spec\.maxNodes go together"):
        script_objects("t.py", "", ScriptOptions(min_nodes=1), "ns", "a")
    with pytest.raises(InvalidJob, match="at most 50 characters"):
        script_objects("t.py", "", ScriptOptions(name="n" * 51), "ns", "a")
    with pytest.raises(InvalidJob, match="more than a ConfigMap holds"):
        script_objects("t.py", "#" * 1_000_001, ScriptOptions(), "ns", "a")
    with pytest.raises(InvalidJob, match=r"spec\.faultTolerance\.minGroups \(3\)"):
        options = ScriptOptions(nodes=2, fault_tolerance="PerStep", min_groups=3)
        script_objects("t.py", "", options, "ns", "a")
    with pytest.raises(InvalidJob, match="launcher 'mpirun' is not one of node, torchrun, auto"):
        script_objects("t.py", "", ScriptOptions(launcher="mpirun"), "ns", "a")


JOB = {
    "metadata": {"name": "digits", "namespace": "team", "uid": "uid-1"},
    "spec": {
        "checkpoint": {"volume": {"persistentVolumeClaim": {"claimName": "ck"}}},
        "imagePullPolicy": "IfNotPresent",
        "template": {
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
            "imagePullSecrets": [{"name": "registry"}],
            "env": [{"name": "X", "value": "1"}],
        },
    },
}


def test_the_reader_pod_prints_metrics_jsonl_from_the_volume_read_only_and_restricted() -> None:
    pod = metrics_reader_pod(JOB, "trainer:1")
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["generateName"] == "digits-plot-" and meta["namespace"] == "team"
    assert LABEL_JOB not in meta["labels"]  # the operator would take it for one of its pods
    assert meta["ownerReferences"] == [
        {"apiVersion": "ddp.dev/v1alpha1", "kind": "DDPJob", "name": "digits", "uid": "uid-1"}
    ]
    (c,) = spec["containers"]
    assert c["image"] == "trainer:1" and c["imagePullPolicy"] == "IfNotPresent"
    assert c["command"] == ["cat", "/checkpoints/metrics.jsonl"]
    assert c["volumeMounts"] == [
        {"name": "checkpoints", "mountPath": "/checkpoints", "readOnly": True}
    ]
    assert spec["volumes"] == [
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ck"}}
    ]
    assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "fsGroup" not in spec["securityContext"]  # nothing to chown for a reader
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert spec["tolerations"] == JOB["spec"]["template"]["tolerations"]  # type: ignore[index]
    assert spec["imagePullSecrets"] == [{"name": "registry"}] and "env" not in c

    moved = {**JOB, "spec": {"checkpoint": {"volume": {"emptyDir": {}}, "path": "/ckpt"}}}
    assert metrics_reader_pod(moved, "i")["spec"]["containers"][0]["command"] == [
        "cat",
        "/ckpt/metrics.jsonl",
    ]
    with pytest.raises(InvalidJob, match="ddpjob digits has no checkpoint volume"):
        metrics_reader_pod({**JOB, "spec": {}}, "i")


def test_the_reader_runs_the_image_the_jobs_pods_run() -> None:
    pod = {"spec": {"containers": [{"name": "trainer", "image": "from-operator:2"}]}}
    assert reader_image({"spec": {"image": "mine:1"}}, [pod]) == "mine:1"
    assert reader_image({"spec": {}}, [pod]) == "from-operator:2"
    assert reader_image({"spec": {}}, []) == OperatorConfig().default_image
    # No pod left: the image the operator last saw the job's pods run.
    assert reader_image({"spec": {}, "status": {"image": "seen:3"}}, []) == "seen:3"
    assert reader_image({"spec": {}, "status": {"image": "seen:3"}}, [pod]) == "from-operator:2"


def test_an_image_the_kubelet_cannot_pull_is_told_apart_from_a_pod_still_starting() -> None:
    def waiting(reason: str, message: str = "") -> dict[str, Any]:
        state = {"waiting": {"reason": reason, "message": message}}
        return {"status": {"containerStatuses": [{"name": "reader", "state": state}]}}

    assert image_trouble(waiting("ContainerCreating")) == ""
    assert image_trouble({"status": {"phase": "Pending"}}) == ""
    assert image_trouble(waiting("ImagePullBackOff", 'Back-off pulling image "x:1"')) == (
        'ImagePullBackOff: Back-off pulling image "x:1"'
    )
    assert image_trouble(waiting("ErrImagePull")) == "ErrImagePull"


def test_a_status_from_a_newer_operator_still_reads() -> None:
    status = status_of(
        {"status": {"phase": "Running", "future": 1, "progress": {"step": 3, "newField": "x"}}}
    )
    assert status.phase == "Running" and status.progress is not None
    assert status.progress.step == 3


def test_the_plot_is_a_png_with_a_loss_and_a_learning_rate_curve(tmp_path: Path) -> None:
    both = draw_curves(
        Curves(loss=[(1, 2.0), (2, 1.0)], lr=[(1, 0.1), (2, 0.2)]), tmp_path / "a.png"
    )
    assert both.lines == 2 and both.path.read_bytes()[:8] == PNG_MAGIC
    loss_only = draw_curves(Curves(loss=[(1, 2.0)], lr=[]), tmp_path / "b.png")
    assert loss_only.lines == 1
    with pytest.raises(ValueError):
        draw_curves(Curves(loss=[], lr=[]), tmp_path / "c.png")


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and out == "", (out, err)
    return lines[0]


def test_a_missing_script_is_one_line_and_exit_code_2_before_any_cluster(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    assert cli.main(["submit", str(tmp_path / "nope.py")]) == 2
    assert one_error_line(capsys) == f"kubectl ddp: no such script: {tmp_path / 'nope.py'}"
    assert cli.main(["submit", str(tmp_path)]) == 2
    assert "is not a file" in one_error_line(capsys)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:%d", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: team}}]
current-context: x
"""


def test_an_unreachable_cluster_is_one_line_and_exit_code_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    port = closed_port()
    kubeconfig.write_text(KUBECONFIG % port)
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    for argv in (
        ["watch", "j"],
        ["logs", "j"],
        ["plot", "j", "-o", "x.png"],
        ["submit", str(script)],
    ):
        assert cli.main([*argv, "--kubeconfig", str(kubeconfig)]) == 2
        line = one_error_line(capsys)
        assert line.startswith(f"kubectl ddp: cannot reach the cluster at https://127.0.0.1:{port}")
        assert "Connection refused" in line
    assert cli.main(["watch", "j", "--kubeconfig", str(tmp_path / "absent")]) == 2
    assert one_error_line(capsys) == f"kubectl ddp: no kubeconfig at {tmp_path / 'absent'}"
    assert cli.main(["watch", "j", "--kubeconfig", str(kubeconfig), "--context", "nope"]) == 2
    assert "nope" in one_error_line(capsys)


class RestartingServer:
    """An API server of the test's own (plain HTTP) that answers a DDPJob's GET with each of
    ``answers`` in turn (HTTP status, phase), then the last one for good."""

    def __init__(self, answers: list[tuple[int, str]]):
        self.answers, self.asked = list(answers), 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's name for it
                code, phase = server.answers[min(server.asked, len(server.answers) - 1)]
                server.asked += 1
                if code == 200:
                    body = {"apiVersion": "ddp.dev/v1alpha1", "kind": "DDPJob"}
                    body |= {"metadata": {"name": "j"}, "status": {"phase": phase}}
                else:
                    body = {"kind": "Status", "code": code, "message": f'{phase} "j"'}
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def kubeconfig(self, tmp_path: Path) -> str:
        path = tmp_path / "kubeconfig"
        port = self.http.server_address[1]
        path.write_text(KUBECONFIG.replace("https://", "http://") % port)
        return str(path)


def test_watch_rides_out_an_api_server_that_restarts_but_not_one_that_refuses_from_the_start(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A restarting API server answers 503, then 403 until its authorizers have synced (seen on
    # kind, the control plane's machine powered off and on under `kubectl ddp watch`).
    forbidden = (403, "ddpjobs.ddp.dev is forbidden: User cannot get resource ddpjobs")
    answers = [(200, "Running"), (200, "Running"), (503, "not ready"), forbidden, forbidden]
    server = RestartingServer([*answers, (200, "Succeeded")])
    assert cli.main(["watch", "j", "--kubeconfig", server.kubeconfig(tmp_path)]) == 0
    out, _ = capsys.readouterr()
    assert out.splitlines() == ["phase Running", "phase Succeeded", "ddpjob j Succeeded"]
    assert server.asked == 6
    # Refused at the first read: the user's own permissions, said at once.
    server = RestartingServer([forbidden])
    assert cli.main(["watch", "j", "--kubeconfig", server.kubeconfig(tmp_path)]) == 2
    assert "not allowed: ddpjobs.ddp.dev is forbidden" in one_error_line(capsys)
    # Refused for longer than a restart takes: said after the patience.
    monkeypatch.setattr(jobs, "API_PATIENCE_S", 2.0)
    server = RestartingServer([(200, "Running"), (200, "Running"), forbidden])
    assert cli.main(["watch", "j", "--kubeconfig", server.kubeconfig(tmp_path)]) == 2
    assert "not allowed" in capsys.readouterr().err
    # Any other error is no restart: said at once.
    server = RestartingServer([(200, "Running"), (200, "Running"), (400, "bad request")])
    assert cli.main(["watch", "j", "--kubeconfig", server.kubeconfig(tmp_path)]) == 2
    assert server.asked == 3


def test_no_cluster_configured_at_all_is_one_line_and_exit_code_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert cli.main(["logs", "j"]) == 2
    assert one_error_line(capsys).startswith("kubectl ddp: no cluster configured: set KUBECONFIG")


def test_flags_are_checked_and_arguments_after_dashes_go_to_the_script(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit:
        cli.main(["submit", "t.py", "--nproc", "0"])
    assert (
        exit.value.code == 2
        and "--nproc: must be an integer >= 1 or auto" in capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        cli.main(["plot", "job"])  # -o is required
    assert "-o/--output" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["logs", "job", "--", "x"])
    assert "for `submit` only" in capsys.readouterr().err
    args = cli.parser().parse_args(
        ["submit", "t.py", "--nproc", "auto", "--min", "1", "--max", "2"]
    )
    assert (args.nproc, args.min_nodes, args.max_nodes) == ("auto", 1, 2)
    assert args.launcher == "auto"
    assert cli.parser().parse_args(["submit", "t.py", "--launcher", "torchrun"]).launcher == (
        "torchrun"
    )
    per_step = ["submit", "t.py", "--fault-tolerance", "PerStep", "--min-groups", "2"]
    args = cli.parser().parse_args([*per_step, "--group-timeout", "9"])
    assert (args.fault_tolerance, args.min_groups, args.group_timeout_s) == ("PerStep", 2, 9)
    with pytest.raises(SystemExit):
        cli.main(["submit", "t.py", "--fault-tolerance", "perstep"])
    assert "--fault-tolerance: invalid choice: 'perstep'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["submit", "t.py", "--launcher", "mpirun"])
    assert "--launcher: invalid choice: 'mpirun'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["-n", "team", "--context", "c", "watch", "job"],  # as before kubectl's own commands
        ["watch", "job", "-n", "team", "--context", "c"],
        ["--namespace", "other", "watch", "job", "--namespace", "team", "--context", "c"],
    ],
)
def test_connection_flags_go_before_or_after_the_command(argv: list[str]) -> None:
    args = cli.parser().parse_args(argv)
    assert (args.command, args.job, args.namespace, args.context) == ("watch", "job", "team", "c")
    assert args.kubeconfig is None  # not given: the client's own default


def test_no_connection_flag_leaves_each_to_the_client() -> None:
    for command in (
        ["watch", "j"],
        ["logs", "j"],
        ["plot", "j", "-o", "x.png"],
        ["submit", "t.py"],
    ):
        args = cli.parser().parse_args(command)
        assert (args.namespace, args.kubeconfig, args.context) == (None, None, None)
