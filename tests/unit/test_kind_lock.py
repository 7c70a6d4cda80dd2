"""One user of the kind cluster at a time: a real flock between real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp_devcluster.kind import lock
from ddp_devcluster.paths import REPO, SOURCE_DIRS

HOLDER = """
import sys, time
from ddp_devcluster.kind.lock import hold
hold("ddp", "the other tests", log=lambda m: None)
print("held", flush=True)
time.sleep(600)
"""


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DDP_CACHE_RUN", str(tmp_path))
    return tmp_path


def _other_holder(run_dir: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "DDP_CACHE_RUN": str(run_dir),
           "PYTHONPATH": os.pathsep.join(str(REPO / d) for d in SOURCE_DIRS)}  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], env=env, stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_waits_saying_for_whom_and_gets_it_once_the_holder_is_killed(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lock, "REPORT_EVERY_S", 0.5)
    other = _other_holder(run_dir)
    said: list[str] = []
    try:
        with pytest.raises(lock.InUse) as refused:
            lock.hold("ddp", "the tests", log=said.append, wait_s=2.5)
        assert f"pid {other.pid} (the other tests in {os.getcwd()}" in str(refused.value)
        assert "make down" in str(refused.value)
        assert said and all(f"in use by pid {other.pid}" in s for s in said)
        assert len(said) >= 2, said  # said at once, and again while it waited
        # Killed, not released: the kernel lets go of its lock, and a waiter gets it.
        other.send_signal(signal.SIGKILL)
        other.wait()
        release = lock.hold("ddp", "the tests", log=said.append, wait_s=10)
        record = lock.lock_path("ddp").read_text()
        assert f'"pid": {os.getpid()}' in record and '"purpose": "the tests"' in record
        release()
        assert lock.lock_path("ddp").read_text() == ""  # nobody is named once it is let go
    finally:
        other.kill()
        other.wait()


def test_holds_in_one_process_nest_and_the_last_release_unlocks(run_dir: Path) -> None:
    outer = lock.hold("ddp", "the tests")
    inner = lock.hold("ddp", "making the cluster")  # `up` inside the session's hold
    inner()
    inner()  # a second call of the same release counts once
    assert '"purpose": "the tests"' in lock.lock_path("ddp").read_text()  # still held
    assert _probe(run_dir, share=False) == "refused"  # ... as another process sees it
    outer()
    assert _probe(run_dir, share=False) == "held"


def test_a_process_started_by_the_holder_uses_the_cluster_on_its_behalf(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cluster suite runs `make demo` as a child while the session holds the cluster."""
    release = lock.hold("ddp", "the tests")
    assert os.environ[lock.HOLDER_ENV] == str(os.getpid())
    assert _probe(run_dir, share=True) == "held"  # no wait, and the parent still holds it
    assert '"purpose": "the tests"' in lock.lock_path("ddp").read_text()
    release()
    assert lock.HOLDER_ENV not in os.environ

    # Naming a holder that did not start this process gives nothing.
    other = _other_holder(run_dir)
    try:
        monkeypatch.setenv(lock.HOLDER_ENV, str(other.pid))
        with pytest.raises(lock.InUse):
            lock.hold("ddp", "the tests", log=lambda m: None, wait_s=0)
    finally:
        other.kill()
        other.wait()


def _probe(run_dir: Path, *, share: bool) -> str:
    """Whether a child process gets the cluster at once ("held") or is refused."""
    env = {**os.environ, "DDP_CACHE_RUN": str(run_dir),
           "PYTHONPATH": os.pathsep.join(str(REPO / d) for d in SOURCE_DIRS)}  # fmt: skip
    if not share:
        env.pop(lock.HOLDER_ENV, None)
    code = ("from ddp_devcluster.kind.lock import hold, InUse\n"
            "try:\n    hold('ddp', 'probe', log=lambda m: None, wait_s=0)\n"
            "except InUse:\n    raise SystemExit(3)\n")  # fmt: skip
    rc = subprocess.run([sys.executable, "-c", code], env=env, check=False).returncode
    assert rc in (0, 3)
    return "held" if rc == 0 else "refused"


def test_ancestors_are_read_from_proc() -> None:
    chain = lock.ancestors(os.getpid())
    assert chain[0] == os.getppid() and os.getpid() not in chain


def test_a_holder_is_described_by_pid_purpose_folder_and_time() -> None:
    record = {"pid": 41, "purpose": "make demo", "cwd": "/src/ddp", "since": 1000.0}
    assert lock.describe(record, 1185.0) == "pid 41 (make demo in /src/ddp, for 3m05s)"
    assert lock.describe(None, time.time()) == "another process"
