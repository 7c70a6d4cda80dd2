"""The shared test harness (ddp_devcluster.harness) against the real API server, with no
operator: the tests write the job's status themselves. A phase wait gives up only when the
status has stopped moving, fails at once on Failed, and a wait that gives up carries the
namespace's diagnostics."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from ddp_devcluster.harness import Harness
from ddp_devcluster.plane import ControlPlane, KubectlError
from ddp_devcluster.polling import TimedOut

pytestmark = pytest.mark.controlplane


@pytest.fixture
def h(ddpjob_crd: ControlPlane) -> Iterator[Harness]:
    harness = Harness(ddpjob_crd.kubeconfig, f"h-{uuid.uuid4().hex[:8]}", 5, 0.1)
    harness.k("create", "namespace", harness.ns, ns="")
    harness.apply({"apiVersion": "ddp.dev/v1alpha1", "kind": "DDPJob",
                   "metadata": {"name": "j"}, "spec": {"nodes": 2}})  # fmt: skip
    yield harness
    harness.k("delete", "namespace", harness.ns, "--wait=false", ns="", check=False)


def set_status(h: Harness, **status: object) -> None:
    patch = json.dumps({"status": status})
    h.k("patch", "ddpjob", "j", "--subresource=status", "--type=merge", "-p", patch)


def test_a_phase_wait_gives_up_only_once_the_status_has_stopped_moving(h: Harness) -> None:
    set_status(h, phase="Running", readyNodes=2, progress={"step": 1})

    def train() -> None:  # a step every 0.5 s for 4 s: longer than the stall timeout
        for step in range(2, 10):
            time.sleep(0.5)
            set_status(h, progress={"step": step})

    trainer = threading.Thread(target=train)
    t0 = time.monotonic()
    trainer.start()
    with pytest.raises(TimedOut) as e:
        h.phase("j", "Succeeded", stall_s=2)
    trainer.join()
    assert time.monotonic() - t0 >= 4
    assert "j Succeeded: nothing moved for 2s" in str(e.value)
    assert "operator log:" in str(e.value) and "NAME" in str(e.value)  # the diagnostics


def test_a_phase_wait_returns_the_status_and_fails_at_once_on_failed(h: Harness) -> None:
    set_status(h, phase="Succeeded")
    assert h.phase("j", ("Succeeded", "Failed"))["phase"] == "Succeeded"
    set_status(h, phase="Failed", reason="BackoffLimitExceeded")
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match=r"j Failed: .*BackoffLimitExceeded"):
        h.phase("j", "Succeeded", stall_s=60)
    assert time.monotonic() - t0 < 30
    with pytest.raises(AssertionError, match="j ended before the hold after step 5"):
        h.held("j", 5)


def test_lookups_of_what_is_not_there_and_kubectl_s_own_words(h: Harness) -> None:
    assert h.job("missing") == {} and h.status("missing") == {}
    assert h.events("missing") == [] and h.workers("j") == {}
    with pytest.raises(TimedOut, match="timed out waiting for nothing after 0s"):
        h.until("nothing", lambda: None, 0)
    said = r"(?s)kubectl -n h-\S+ get ddpjob missing failed \(1\):.*NotFound"
    with pytest.raises(KubectlError, match=said):
        h.k("get", "ddpjob", "missing")
