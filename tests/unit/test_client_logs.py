"""`DDPClient.logs` against a fake Kubernetes API: every node's log merged in time order, once
or followed (pods that start later, a stream that breaks off, the end of the job), the API's
refusal as one line, and the logs kept on the volume once the pods are gone. The real pods/log
path runs in tests/e2e/test_kubectl_ddp_e2e.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import urllib3
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from ddp_client import DDPClient, DDPError, NoKeptLogs
from ddp_client import logs as logs_module
from ddp_client.log_dump import dump
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
        self.spec: dict[str, Any] = {}
        self.pods: list[dict[str, Any]] = []
        self.follows: dict[str, list[Stream]] = {}  # successive streams of each pod
        self.texts: dict[str, str] = {}
        self.refuse: ApiException | None = None
        self.readers: list[dict[str, Any]] = []  # the reader pods created
        self.deleted: list[str] = []

    # CustomObjectsApi
    def get_namespaced_custom_object(self, *args: Any, **kw: Any) -> dict[str, Any]:
        self.reads += 1
        phase = "Running" if self.reads <= self.running_reads else "Succeeded"
        meta = {
            "name": "j",
            "namespace": "ns",
            "uid": "u",
            "creationTimestamp": stamp(0)[:19] + "Z",
        }
        return {"metadata": meta, "spec": self.spec, "status": {"phase": phase}}

    def create_namespaced_pod(self, namespace: str, body: dict[str, Any], **kw: Any) -> Any:
        self.readers.append(body)
        return {"metadata": {"name": "j-logs-abcde"}}

    def read_namespaced_pod(self, name: str, namespace: str, **kw: Any) -> dict[str, Any]:
        return {"metadata": {"name": name}, "status": {"phase": "Succeeded"}}

    def delete_namespaced_pod(self, name: str, namespace: str, **kw: Any) -> None:
        self.deleted.append(name)

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
    ddp._models = SimpleNamespace(V1Pod=SimpleNamespace(model_validate=lambda m: m))
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


def dumped(folder: Path, files: dict[str, str]) -> str:
    """What the reader pod prints of these kept files (its program, run here)."""
    (folder / "logs").mkdir()
    for name, text in files.items():
        (folder / "logs" / name).write_text(text)
    out: list[str] = []
    dump(str(folder / "logs"), "j-node-", 10**6, out.append)
    return "".join(out)


CKPT = {"volume": {"persistentVolumeClaim": {"claimName": "ck"}}, "path": "/ckpt"}


def test_once_the_pods_are_gone_the_logs_kept_on_the_volume_are_merged_like_theirs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cluster = FakeCluster()
    cluster.spec = {"checkpoint": CKPT, "image": "trainer:1"}
    cluster.texts["j-logs-abcde"] = dumped(
        tmp_path,
        {
            # node 0's first attempt (rotated), then its second; a line of an earlier job of
            # the same name, before this one was created, is not shown
            "j-node-0.log.1": f"2026-03-01T09:59:59.5Z old job\n{stamp(1)} [rank0]: a\n",
            "j-node-0.log": f"{stamp(3)} [rank0]: c\n",
            "j-node-1.log": f"{stamp(2)} [rank1]: b\n{stamp(4)} agent: done\n",
        },
    )
    ddp = client_of(cluster, monkeypatch)
    notes: list[str] = []
    lines = list(ddp.logs("j", on_note=notes.append))
    assert [line.show() for line in lines] == [
        "[node-0 rank0] a",
        "[node-1 rank1] b",
        "[node-0 rank0] c",
        "[node-1] agent: done",
    ]
    assert lines[0].show(timestamps=True) == f"{stamp(1)} [node-0 rank0] a"
    assert notes == ["ddpjob j has no pods: reading the logs its nodes kept on its volume"]
    (reader,) = cluster.readers
    assert reader["spec"]["containers"][0]["image"] == "trainer:1"
    assert cluster.deleted == ["j-logs-abcde"]
    assert [line.text for line in ddp.logs("j", rank=1)] == ["b"]


def test_the_volume_is_read_on_request_while_pods_exist_and_never_followed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cluster = FakeCluster()
    cluster.spec = {"checkpoint": CKPT}
    cluster.pods = [pod(0, "terminated")]
    cluster.texts = {
        "j-node-0": f"{stamp(3)} [rank0]: second attempt\n",
        "j-logs-abcde": dumped(
            tmp_path,
            {
                "j-node-0.log": f"{stamp(1)} [rank0]: first attempt\n"
                f"{stamp(3)} [rank0]: second attempt\n"
            },
        ),
    }
    ddp = client_of(cluster, monkeypatch)
    assert [line.text for line in ddp.logs("j")] == ["second attempt"]
    assert cluster.readers == []
    assert [line.text for line in ddp.logs("j", from_volume=True)] == [
        "first attempt",
        "second attempt",
    ]
    with pytest.raises(DDPError, match="--follow streams the pods' logs"):
        list(ddp.logs("j", follow=True, from_volume=True))


def test_a_job_that_kept_no_logs_says_why(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cluster = FakeCluster()
    ddp = client_of(cluster, monkeypatch)
    notes: list[str] = []
    assert list(ddp.logs("j", on_note=notes.append)) == []  # no pods, no volume: as before
    assert notes == ["ddpjob j has no pods, and no checkpoint volume that kept their logs"]
    with pytest.raises(NoKeptLogs, match="ddpjob j has no checkpoint volume"):
        list(ddp.logs("j", from_volume=True))

    cluster.spec = {"checkpoint": CKPT}  # a volume, but the pods ran a command of the user's
    cluster.texts["j-logs-abcde"] = dumped(tmp_path, {})
    with pytest.raises(NoKeptLogs, match=r"ddpjob j kept no logs in /ckpt/logs on its checkpoint"):
        list(ddp.logs("j"))
