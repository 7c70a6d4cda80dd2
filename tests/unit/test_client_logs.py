"""`DDPClient.logs` against a fake Kubernetes API: every node's log merged in time order, once
or followed (pods that start later, a stream that breaks off, the end of the job), and the
API's refusal as one line. The real pods/log path runs in tests/e2e/test_kubectl_ddp_e2e.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import urllib3
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from ddp_client import DDPClient, DDPError
from ddp_client import logs as logs_module
from ddp_operator.render import LABEL_INDEX


def stamp(second: int) -> str:
    return f"2026-03-01T10:00:{second:02d}.5Z"


def pod(index: int, state: str = "running") -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"j-node-{index}",
            "namespace": "ns",
            "uid": f"uid-{index}",
            "labels": {LABEL_INDEX: str(index)},
        },
        "status": {"containerStatuses": [{"name": "trainer", "state": {state: {}}}]},
    }


class Stream:
    def __init__(self, chunks: list[bytes], breaks: bool = False):
        self.chunks, self.breaks = chunks, breaks

    def stream(self, amt: int | None = None, decode_content: bool = False) -> Iterator[bytes]:
        for chunk in self.chunks:
            time.sleep(0.01)
            yield chunk
        if self.breaks:
            raise urllib3.exceptions.ProtocolError("Connection broken")

    def close(self) -> None:
        pass


class FakeCluster:
    """A job whose status is read ``running_reads`` times as Running, then Succeeded."""

    def __init__(self, running_reads: int = 1):
        self.reads = 0
        self.running_reads = running_reads
        self.pods: list[dict[str, Any]] = []
        self.follows: dict[str, list[Stream]] = {}  # successive streams of each pod
        self.texts: dict[str, str] = {}
        self.refuse: ApiException | None = None

    # CustomObjectsApi
    def get_namespaced_custom_object(self, *args: Any, **kw: Any) -> dict[str, Any]:
        self.reads += 1
        phase = "Running" if self.reads <= self.running_reads else "Succeeded"
        return {"metadata": {"name": "j"}, "status": {"phase": phase}}

    # CoreV1Api
    def list_namespaced_pod(self, namespace: str, **kw: Any) -> dict[str, Any]:
        return {"items": [p for p in self.pods if self.reads >= p.get("_from_read", 0)]}

    def read_namespaced_pod_log(self, name: str, namespace: str, **kw: Any) -> Any:
        if self.refuse is not None:
            raise self.refuse
        if kw.get("follow"):
            return self.follows[name].pop(0)
        if name not in self.texts:
            message = f'container "trainer" in pod "{name}" is waiting to start'
            raise ApiException(
                status=400, reason="Bad Request", body=json.dumps({"message": message})
            )
        return self.texts[name]


def client_of(cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch) -> DDPClient:
    monkeypatch.setattr(logs_module, "POD_LIST_INTERVAL_S", 0.05)
    ddp = DDPClient.__new__(DDPClient)
    ddp.namespace, ddp.server = "ns", "https://fake"
    ddp._api = ApiClient()  # only to turn the fake's dicts into dicts
    ddp._core = ddp._custom = cluster
    return ddp


def test_logs_merge_every_nodes_whole_log_in_time_order(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = FakeCluster()
    cluster.pods = [pod(1, "terminated"), pod(0, "terminated"), pod(2, "waiting")]
    cluster.texts = {
        "j-node-0": f"{stamp(1)} [rank0]: a\n{stamp(3)} [rank0]: c\n",
        "j-node-1": f"{stamp(2)} [rank1]: b\n{stamp(4)} agent: done\n",
    }
    ddp = client_of(cluster, monkeypatch)
    assert [line.show() for line in ddp.logs("j")] == [
        "[node-0 rank0] a",
        "[node-1 rank1] b",
        "[node-0 rank0] c",
        "[node-1] agent: done",
    ]
    assert [line.text for line in ddp.logs("j", rank=1)] == ["b"]


def test_following_merges_live_streams_resumes_a_broken_one_and_ends_with_the_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = FakeCluster(running_reads=3)
    late = pod(1)
    late["_from_read"] = 2  # listed from the job's second status read on
    cluster.pods = [pod(0), late]
    whole0 = f"{stamp(1)} [rank0]: one\n{stamp(3)} [rank0]: three\n{stamp(5)} [rank0]: five\n"
    cluster.follows = {
        "j-node-0": [
            # a line split between chunks; then the connection breaks while the pod runs
            Stream([whole0[:10].encode(), whole0[10:40].encode()], breaks=True),
            Stream([whole0.encode()]),  # followed again: the whole log once more
        ],
        "j-node-1": [Stream([f"{stamp(2)} [rank1]: two\n{stamp(4)} [rank1]: four".encode()])],
    }
    ddp = client_of(cluster, monkeypatch)
    lines = list(ddp.logs("j", follow=True))
    assert [line.text for line in lines] == ["one", "two", "three", "four", "five"]
    assert [line.node for line in lines] == [0, 1, 0, 1, 0]
    assert cluster.follows["j-node-0"] == []  # both streams of node 0 were used


def test_a_log_the_api_refuses_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = FakeCluster(running_reads=100)
    cluster.pods = [pod(0)]
    body = json.dumps({"kind": "Status", "message": 'Get "https://node-0:10250/...": refused'})
    cluster.refuse = ApiException(status=500, reason="Internal Server Error", body=body)
    ddp = client_of(cluster, monkeypatch)
    expected = 'cannot read the log of pod j-node-0: Get "https://node-0:10250/...": refused'
    with pytest.raises(DDPError) as once:
        list(ddp.logs("j"))
    assert str(once.value) == expected
    with pytest.raises(DDPError) as followed:
        list(ddp.logs("j", follow=True))
    assert str(followed.value) == expected
