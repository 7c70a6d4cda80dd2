"""No etcd, kube-* or kwok process outlives the run that started it: not when a test fails,
not when pytest is interrupted, not even when pytest is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from ddp_devcluster.paths import source_path
from ddp_devcluster.plane import MARKER_ENV, processes_with_marker

pytestmark = pytest.mark.controlplane

REPO = Path(__file__).resolve().parents[2]

NESTED_TEST = """
import os, time
from pathlib import Path

def test_uses_the_plane(control_plane):
    control_plane.kubectl("get", "nodes")
    ready = Path(os.environ["READY_FILE"])
    ready.write_text("up")
    proceed = ready.with_name("proceed")
    while not proceed.exists():
        time.sleep(0.1)
    if os.environ["MODE"] == "fail":
        assert False, "this test fails on purpose"
    time.sleep(600)
"""


def run_nested(tmp_path: Path, mode: str) -> tuple[str, int]:
    """Run a one-test pytest session that starts a plane; end it per ``mode``."""
    marker = uuid.uuid4().hex
    (tmp_path / "test_nested.py").write_text(NESTED_TEST)
    ready = tmp_path / "ready"
    env = {
        **os.environ,
        MARKER_ENV: marker,
        "MODE": mode,
        "READY_FILE": str(ready),
        "DDP_DEVCLUSTER_NODES": "1",
        "PYTHONPATH": source_path(),
        # The plane's folder (etcd's data, ~120 MB) in this test's: a SIGKILLed session
        # cannot remove it, and in /tmp it outlived every run.
        "TMPDIR": str(tmp_path),
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "ddp_devcluster.pytest_plugin",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_nested.py"),
        ],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # A shell starts background jobs with SIGINT ignored, and children inherit that: the
        # nested session must take SIGINT as a terminal's Ctrl-C, however CI was started.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ready.exists(), f"the nested plane never came up:\n{proc.communicate()[0][-3000:]}"
    # pytest itself, etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok
    assert len(processes_with_marker(marker)) >= 6
    (tmp_path / "proceed").write_text("")
    if mode == "interrupt":
        proc.send_signal(signal.SIGINT)
    elif mode == "kill":
        proc.send_signal(signal.SIGKILL)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"the nested session did not end ({mode}):\n{out[-4000:]}") from None
    return marker, proc.returncode if out is not None else -1


def wait_gone(marker: str, timeout_s: float = 15) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := processes_with_marker(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.mark.parametrize("mode", ["fail", "interrupt", "kill"])
def test_no_process_outlives_the_session(tmp_path: Path, mode: str) -> None:
    marker, rc = run_nested(tmp_path, mode)
    expected_rc = {"fail": 1, "interrupt": 2, "kill": -signal.SIGKILL}[mode]
    assert rc == expected_rc
    assert wait_gone(marker) == []
