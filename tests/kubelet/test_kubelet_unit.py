"""The test kubelet's pure decisions: env, argv, volumes, status, DNS answers, addresses."""

from __future__ import annotations

import base64
import socket
import struct
from typing import Any

import pytest

from ddp_devcluster import dns, netns, podspec
from ddp_devcluster.podspec import ContainerRecord, PodConfigError, PodContext, Termination


def pod(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u-1",
            "labels": {"app": "a", "role": "w"},
            "annotations": {"note": 'say "hi"'},
        },
        "spec": {"nodeName": "tk-0", "serviceAccountName": "sa", **spec},
        "status": {},
    }


CTX = PodContext(
    pod(),
    "10.1.1.2",
    "10.1.1.1",
    configmaps={"cm": {"data": {"k": "v", "x": "y"}}},
    secrets={"s": {"data": {"pw": base64.b64encode(b"secret").decode()}}},
    allocatable={"cpu": "64", "memory": "256Gi"},
)


# -- expansion and env --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)-$(B)", "1-$(B)"),
        ("$$(A)", "$(A)"),
        ("$$", "$"),
        ("a$b", "a$b"),
        ("$(A", "$(A"),
        ("end$", "end$"),
        ("$(A)$(A)", "11"),
    ],
)
def test_expand_follows_kubernetes(text: str, expected: str) -> None:
    assert podspec.expand(text, {"A": "1"}.get) == expected


def test_field_refs() -> None:
    p = pod(hostname="h")
    ref = lambda path: podspec.field_ref(p, path, "10.1.1.2", "10.1.1.1")  # noqa: E731
    assert ref("metadata.name") == "p"
    assert ref("metadata.namespace") == "ns"
    assert ref("metadata.uid") == "u-1"
    assert ref("metadata.labels['app']") == "a"
    assert ref("metadata.labels['missing']") == ""
    assert ref("metadata.annotations['note']") == 'say "hi"'
    assert ref("metadata.labels") == 'app="a"\nrole="w"'
    assert ref("spec.nodeName") == "tk-0"
    assert ref("spec.serviceAccountName") == "sa"
    assert ref("status.podIP") == "10.1.1.2"
    assert ref("status.hostIP") == "10.1.1.1"
    with pytest.raises(PodConfigError):
        ref("spec.nope")


def test_container_env_order_refs_and_expansion() -> None:
    c = {
        "name": "main",
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
        "env": [
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}},
            {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "s", "key": "pw"}}},
            {"name": "ADDR", "value": "$(IP):$(PORT)"},
            {"name": "PORT", "value": "80"},
            {"name": "PATHX", "value": "$(PATH):/x"},
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
            {
                "name": "OPT",
                "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "k", "optional": True}},
            },
        ],
    }
    env = podspec.container_env(c, CTX, {"PATH": "/bin"})
    assert env == {
        "PATH": "/bin",
        "CM_k": "v",
        "CM_x": "y",
        "IP": "10.1.1.2",
        "K": "v",
        "PW": "secret",
        "ADDR": "10.1.1.2:$(PORT)",  # PORT is defined after ADDR: left as written
        "PORT": "80",
        "PATHX": "/bin:/x",
        "CPU": "64",
    }


def test_missing_references_are_config_errors() -> None:
    c = {"env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "no"}}}]}
    with pytest.raises(PodConfigError, match="key"):
        podspec.container_env(c, CTX)
    c = {"envFrom": [{"secretRef": {"name": "gone"}}]}
    with pytest.raises(PodConfigError, match="not found"):
        podspec.container_env(c, CTX)


def test_argv_is_command_plus_args_expanded() -> None:
    env = {"N": "2"}
    c = {"name": "m", "command": ["torchrun", "--nnodes=$(N)"], "args": ["x.py", "$$(N)"]}
    assert podspec.container_argv(c, env) == ["torchrun", "--nnodes=2", "x.py", "$(N)"]
    assert podspec.container_argv({"name": "m", "args": ["python", "-V"]}, env) == [
        "python",
        "-V",
    ]
    with pytest.raises(PodConfigError, match="ignores images"):
        podspec.container_argv({"name": "m"}, env)


def test_resource_quantities() -> None:
    assert podspec.quantity("500m") == 0.5
    assert podspec.quantity("2") == 2
    assert podspec.quantity("1Gi") == 2**30
    assert podspec.quantity("3M") == 3_000_000
    c = {"resources": {"limits": {"cpu": "1500m", "memory": "2Mi"}}}
    assert podspec.resource_field_ref(c, {"resource": "limits.cpu"}, {}) == "2"
    ref = {"resource": "limits.memory", "divisor": "1Ki"}
    assert podspec.resource_field_ref(c, ref, {}) == "2048"


# -- volumes ------------------------------------------------------------------------------
def test_volume_plans_map_kinds_to_state_directories() -> None:
    p = pod(
        volumes=[
            {"name": "scratch", "emptyDir": {}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
            {"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}},
            {"name": "host", "hostPath": {"path": "/var/lib/x"}},
            {"name": "hostfile", "hostPath": {"path": "/etc/x.conf", "type": "File"}},
            {"name": "cfg", "configMap": {"name": "cm"}},
        ]
    )
    plans = {v.name: v for v in podspec.plan_volumes(p, "/st")}
    assert plans["scratch"].host_path == "/st/pods/u-1/volumes/scratch"
    assert plans["shm"].memory and plans["shm"].size_limit == str(
        2**30
    )  # bytes, as tmpfs takes them
    assert plans["ckpt"].host_path == "/st/pvc/ns/ckpt"
    assert plans["host"].host_path == "/st/nodes/tk-0/hostpath/var/lib/x"
    assert plans["hostfile"].is_file
    assert plans["cfg"].kind == "files" and plans["cfg"].readonly
    with pytest.raises(PodConfigError, match="unsupported"):
        podspec.plan_volumes(pod(volumes=[{"name": "x", "nfs": {}}]), "/st")


def test_claim_directories_are_shared_per_namespace_and_claim() -> None:
    a = pod(volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "c"}}])
    b = {**pod(volumes=[{"name": "e", "persistentVolumeClaim": {"claimName": "c"}}])}
    b["metadata"] = {**b["metadata"], "uid": "u-2", "name": "q"}
    [pa], [pb] = podspec.plan_volumes(a, "/st"), podspec.plan_volumes(b, "/st")
    assert pa.host_path == pb.host_path


def test_configmap_secret_and_projected_files() -> None:
    cm = {"configMap": {"name": "cm", "items": [{"key": "k", "path": "sub/k.txt"}]}}
    assert podspec.volume_files(cm, CTX, {}) == [podspec.FileSpec("sub/k.txt", b"v", 0o644)]
    sec = {"secret": {"secretName": "s", "defaultMode": 0o400}}
    assert podspec.volume_files(sec, CTX, {}) == [podspec.FileSpec("pw", b"secret", 0o400)]
    sat = {"expirationSeconds": 3607, "path": "token"}
    projected = {
        "projected": {
            "sources": [
                {"serviceAccountToken": sat},
                {"configMap": {"name": "cm", "items": [{"key": "x", "path": "ca.crt"}]}},
                {
                    "downwardAPI": {
                        "items": [
                            {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}
                        ]
                    }
                },
            ]
        }
    }
    files = podspec.volume_files(projected, CTX, {podspec.token_key(sat): "TOKEN"})
    assert {f.path: f.data for f in files} == {
        "token": b"TOKEN",
        "ca.crt": b"y",
        "namespace": b"ns",
    }
    assert podspec.token_requests({"spec": {"volumes": [projected, projected]}}) == [sat]
    missing = {"configMap": {"name": "nope", "optional": True}}
    assert podspec.volume_files(missing, CTX, {}) == []


def test_referenced_objects() -> None:
    p = pod(
        volumes=[
            {"name": "a", "configMap": {"name": "c1"}},
            {"name": "b", "secret": {"secretName": "s1"}},
        ],
        containers=[
            {
                "name": "m",
                "envFrom": [{"configMapRef": {"name": "c2"}}],
                "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s2", "key": "k"}}}],
            }
        ],
    )
    assert podspec.referenced_objects(p) == ({"c1", "c2"}, {"s1", "s2"})


def test_container_mounts_sub_paths_and_order() -> None:
    plans = [
        podspec.VolumePlan("data", "emptyDir", "/st/d"),
        podspec.VolumePlan("cfg", "files", "/st/c", readonly=True),
    ]
    c = {
        "volumeMounts": [
            {"name": "data", "mountPath": "/data/logs", "subPath": "logs"},
            {"name": "data", "mountPath": "/data"},
            {"name": "cfg", "mountPath": "/cfg"},
            {"name": "data", "mountPath": "/per-pod", "subPathExpr": "$(POD)"},
        ]
    }
    mounts = podspec.container_mounts(c, plans, {"POD": "p1"})
    assert [(m.source, m.target, m.readonly) for m in mounts] == [
        ("/st/d", "/data", False),
        ("/st/c", "/cfg", True),
        ("/st/d/p1", "/per-pod", False),
        ("/st/d/logs", "/data/logs", False),
    ]
    with pytest.raises(PodConfigError, match="inside the volume"):
        podspec.container_mounts(
            {"volumeMounts": [{"name": "data", "mountPath": "/x", "subPath": "../up"}]}, plans, {}
        )


def test_hosts_and_resolv_conf() -> None:
    hosts = podspec.hosts_file(pod(hostname="w-0", subdomain="job"), "10.1.1.2", "cluster.local")
    assert "10.1.1.2\tw-0.job.ns.svc.cluster.local w-0\n" in hosts
    assert "127.0.0.1\tlocalhost" in hosts
    assert podspec.pod_hostname(pod()) == "p"
    conf = podspec.resolv_conf("ns", "10.1.0.1", "cluster.local")
    assert conf.splitlines() == [
        "nameserver 10.1.0.1",
        "search ns.svc.cluster.local svc.cluster.local cluster.local",
        "options ndots:5",
    ]


# -- status -------------------------------------------------------------------------------
T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:00:05Z"


def rec(name: str = "main", **kw: Any) -> ContainerRecord:
    return ContainerRecord(name, **kw)


@pytest.mark.parametrize(
    ("policy", "codes", "phase"),
    [
        ("Never", [0], "Succeeded"),
        ("Never", [3], "Failed"),
        ("Never", [0, 3], "Failed"),
        ("OnFailure", [0], "Succeeded"),
        ("OnFailure", [1], "Running"),  # it restarts
        ("Always", [0], "Running"),
    ],
)
def test_phase_when_containers_end(policy: str, codes: list[int], phase: str) -> None:
    records = [rec(f"c{i}", last=Termination(c, T0, T1)) for i, c in enumerate(codes)]
    assert podspec.pod_phase(policy, records, sandbox_ready=True) == phase


def test_phase_before_and_while_running() -> None:
    assert podspec.pod_phase("Never", [rec()], sandbox_ready=False) == "Pending"
    assert podspec.pod_phase("Never", [rec()], sandbox_ready=True) == "Pending"
    assert podspec.pod_phase("Never", [rec(running_since=T0)], sandbox_ready=True) == "Running"
    one_done = [rec("a", running_since=T0), rec("b", last=Termination(0, T0, T1))]
    assert podspec.pod_phase("Never", one_done, sandbox_ready=True) == "Running"


def test_init_containers_run_in_order_and_gate_the_pod() -> None:
    ok, bad = Termination(0, T0, T1), Termination(2, T0, T1)
    first, second = rec("i1"), rec("i2")
    assert podspec.init_state("Never", [first, second]) == "pending"
    assert podspec.next_init([first, second]) is first
    first.last = ok
    assert podspec.next_init([first, second]) is second
    assert podspec.pod_phase("Never", [rec()], True, [first, second]) == "Pending"
    second.last = bad
    assert podspec.init_state("Always", [first, second]) == "pending"  # it restarts
    assert podspec.init_state("Never", [first, second]) == "failed"
    assert podspec.pod_phase("Never", [rec()], True, [first, second]) == "Failed"
    second.last = ok
    assert podspec.init_state("Never", [first, second]) == "done"
    assert podspec.next_init([first, second]) is None
    assert podspec.pod_phase("Never", [rec(running_since=T0)], True, [first, second]) == "Running"
    p = pod(initContainers=[{"name": "i1"}], containers=[{"name": "main"}])
    kw = dict(sandbox_ready=True, pod_ip="10.1.1.2", host_ip="10.1.1.1", start_time=T0, now=T1)
    st = podspec.pod_status(p, [rec()], inits=[rec("i1", running_since=T0)], **kw)  # type: ignore[arg-type]
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Initialized"]["status"] == "False"
    assert conds["Initialized"]["reason"] == "ContainersNotInitialized"
    assert st["initContainerStatuses"][0]["state"] == {"running": {"startedAt": T0}}


def test_restart_policy_and_backoff() -> None:
    assert podspec.restarts("Always", 0) and podspec.restarts("OnFailure", 2)
    assert not podspec.restarts("OnFailure", 0) and not podspec.restarts("Never", 1)
    assert [podspec.backoff_s(n) for n in range(7)] == [0.5, 1, 2, 4, 8, 10, 10]


def test_pod_status_running_then_failed() -> None:
    p = pod(restartPolicy="Never", containers=[{"name": "main", "image": "img"}])
    p["status"] = {
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": "t-sched"},
            {"type": "DisruptionTarget", "status": "True"},
        ]
    }
    kw = dict(sandbox_ready=True, pod_ip="10.1.1.2", host_ip="10.1.1.1", start_time=T0, now=T1)
    st = podspec.pod_status(p, [rec(running_since=T0)], **kw)  # type: ignore[arg-type]
    assert st["phase"] == "Running" and st["podIP"] == "10.1.1.2"
    assert st["podIPs"] == [{"ip": "10.1.1.2"}] and st["hostIP"] == "10.1.1.1"
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Ready"]["status"] == conds["ContainersReady"]["status"] == "True"
    assert conds["PodScheduled"]["lastTransitionTime"] == "t-sched"  # kept, not reset
    assert "DisruptionTarget" in conds  # other writers' conditions survive
    [cs] = st["containerStatuses"]
    assert cs["state"] == {"running": {"startedAt": T0}} and cs["ready"] and cs["image"] == "img"

    done = rec(restart_count=0, last=Termination(3, T0, T1))
    st = podspec.pod_status(p, [done], **kw)  # type: ignore[arg-type]
    assert st["phase"] == "Failed"
    [cs] = st["containerStatuses"]
    assert cs["state"]["terminated"] == {
        "exitCode": 3,
        "reason": "Error",
        "startedAt": T0,
        "finishedAt": T1,
    }
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Ready"]["reason"] == "PodCompleted"


def test_container_status_crash_loop_and_last_state() -> None:
    waiting = rec(restart_count=1, last=Termination(1, T0, T1), restart_at=5.0)
    cs = podspec.container_status(waiting, "img", "tk://x", "Running")
    assert cs["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert cs["lastState"]["terminated"]["exitCode"] == 1 and cs["restartCount"] == 1
    again = rec(restart_count=1, running_since=T1, last=Termination(1, T0, T1))
    cs = podspec.container_status(again, "img", "tk://x", "Running")
    assert "running" in cs["state"] and cs["lastState"]["terminated"]["reason"] == "Error"
    cs = podspec.container_status(rec(config_error="cm missing"), "i", "", "Pending")
    assert cs["state"]["waiting"] == {
        "reason": "CreateContainerConfigError",
        "message": "cm missing",
    }
    assert podspec.container_status(rec(), "i", "", "Pending")["state"]["waiting"] == {
        "reason": "ContainerCreating"
    }


def test_records_from_an_earlier_kubelet() -> None:
    p = pod(restartPolicy="OnFailure")
    p["status"] = {
        "containerStatuses": [
            {"name": "a", "restartCount": 2, "state": {"running": {"startedAt": T0}}},
            {"name": "b", "state": {"terminated": {"exitCode": 0, "startedAt": T0}}},
        ]
    }
    recs = podspec.records_from_status(p, T1)
    assert recs["a"].last == Termination(137, T0, T1, "ContainerStatusUnknown")
    assert recs["a"].restart_count == 2 and recs["a"].restart_at == 0.0  # restarts at once
    assert recs["b"].last is not None and recs["b"].restart_at is None


# -- DNS ----------------------------------------------------------------------------------
def svc(name: str, selector: dict[str, str] | None, headless: bool = True, **spec: Any) -> dict:
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"selector": selector, "clusterIP": "None" if headless else "10.96.0.9", **spec},
    }


def dpod(name: str, ip: str, labels: dict[str, str], ready: bool = True, **spec: Any) -> dict:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": name, "labels": labels},
        "spec": spec,
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def test_dns_records_for_headless_services_and_hostnames() -> None:
    pods = [
        dpod("w-0", "10.1.1.2", {"app": "w"}, hostname="w-0", subdomain="job"),
        dpod("w-1", "10.1.2.2", {"app": "w"}, ready=False, hostname="w-1", subdomain="job"),
        dpod("other", "10.1.1.9", {"app": "x"}),
        {**dpod("done", "10.1.1.7", {"app": "w"}), "status": {"phase": "Succeeded"}},
    ]
    pods.append(dpod("late", "", {"app": "w"}, ready=False))
    services = [
        svc("job", {"app": "w"}, publishNotReadyAddresses=True),
        svc("ready-only", {"app": "w"}),
        svc("clusterip", {"app": "x"}, headless=False),
        svc("manual", None),
        {"metadata": {"name": "kubernetes", "namespace": "default"}, "spec": {}},
    ]
    table = dns.records(services, pods, api_ip="10.1.0.1", local_ips={"late": "10.1.1.3"})
    assert table == {
        "job.ns.svc.cluster.local": ["10.1.1.2", "10.1.1.3", "10.1.2.2"],
        "w-0.job.ns.svc.cluster.local": ["10.1.1.2"],
        "w-1.job.ns.svc.cluster.local": ["10.1.2.2"],
        "ready-only.ns.svc.cluster.local": ["10.1.1.2"],
        "clusterip.ns.svc.cluster.local": ["10.1.1.9"],
        "kubernetes.default.svc.cluster.local": ["10.1.0.1"],
    }
    assert dns.lookup(table, "JOB.ns.svc.cluster.local.") == table["job.ns.svc.cluster.local"]
    assert dns.lookup(table, "w-0.job.ns.svc") == ["10.1.1.2"]
    assert dns.lookup(table, "job") is None  # short names come from the search path
    assert dns.lookup(table, "example.com") is None


def query(name: str, qtype: int = 1, qid: int = 7) -> bytes:
    q = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + q + struct.pack("!HH", qtype, 1)


def parse_answer(msg: bytes) -> tuple[int, int, list[str], bool]:
    qid, flags, _qd, an = struct.unpack("!HHHH", msg[:8])
    question = dns.parse_query(msg)[5]
    i = 12 + len(question)
    ips = []
    for _ in range(an):
        rdlen = struct.unpack("!H", msg[i + 10 : i + 12])[0]
        ips.append(socket.inet_ntoa(msg[i + 12 : i + 12 + rdlen]))
        i += 12 + rdlen
    return qid, flags & 0xF, ips, bool(flags & 0x0200)


def test_dns_wire_answers() -> None:
    table = {"a.ns.svc.cluster.local": ["10.0.0.1", "10.0.0.2"]}
    assert parse_answer(dns.answer(query("a.ns.svc.cluster.local"), table)) == (
        7,
        dns.RCODE_OK,
        ["10.0.0.1", "10.0.0.2"],
        False,
    )
    # AAAA of a known name: NOERROR with no answers, so resolvers use the A records
    assert parse_answer(dns.answer(query("a.ns.svc.cluster.local", 28), table))[1:3] == (0, [])
    assert parse_answer(dns.answer(query("b.ns.svc.cluster.local"), table))[1] == 3
    many = {"m.ns.svc.cluster.local": [f"10.0.{i // 250}.{i % 250}" for i in range(100)]}
    _qid, _rcode, ips, truncated = parse_answer(dns.answer(query("m.ns.svc.cluster.local"), many))
    assert truncated and ips == []
    tcp = dns.answer(query("m.ns.svc.cluster.local"), many, max_size=65535)
    assert len(parse_answer(tcp)[2]) == 100
    assert dns.answer(b"\x00\x01junk", table)[3] & 0xF == dns.RCODE_FORMERR


def test_dns_server_answers_a_real_resolver_query() -> None:
    server = dns.DnsServer("127.0.0.1", 0).start()
    try:
        server.update({"x.ns.svc.cluster.local": ["10.9.9.9"]})
        port = server.udp.getsockname()[1]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(5)
            s.sendto(query("x.ns.svc.cluster.local"), ("127.0.0.1", port))
            assert parse_answer(s.recv(512))[2] == ["10.9.9.9"]
    finally:
        server.stop()


# -- addresses ----------------------------------------------------------------------------
def test_subnet_choice_avoids_taken_networks() -> None:
    assert netns.pick_subnet([]) == 100
    assert netns.pick_subnet(["10.100.0.0/16", "10.101.3.0/24", "192.168.0.0/16"]) == 102
    with pytest.raises(RuntimeError):
        netns.pick_subnet(["10.0.0.0/8"])


def test_pod_addresses_per_node() -> None:
    assert netns.allocate_ip("10.100", 2, set()) == "10.100.2.2"
    assert netns.allocate_ip("10.100", 2, {"10.100.2.2", "10.100.2.3"}) == "10.100.2.4"
    full = {f"10.100.1.{h}" for h in range(2, 255)}
    with pytest.raises(RuntimeError):
        netns.allocate_ip("10.100", 1, full)


def test_stale_names_belong_to_no_live_instance() -> None:
    links = ["eth0", "ddkabc123b", "ddkabc123p1", "ddkdef456b", "ddk"]
    assert netns.stale_names(links, {"abc123"}, "link") == ["ddkdef456b"]
    spaces = ["ddk-abc123-1", "ddk-def456-2", "other"]
    assert netns.stale_names(spaces, {"abc123"}, "netns") == ["ddk-def456-2"]


def test_mount_points_outlive_an_instance_while_another_is_live(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pods of every instance mount on the same host paths, and removing a mount point
    detaches the mounts on it in every namespace: the instance that created one hands it
    over to a live instance instead of removing it under that instance's pods."""
    import json
    import os

    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.setattr(netns, "run_dir", lambda: run)
    point = tmp_path / "checkpoints"
    point.mkdir()
    st = os.lstat(point)
    me = {"pid": os.getpid(), "start": netns._start_time(os.getpid())}
    for inst in ("zz0001", "zz0002"):
        (run / f"{inst}.json").write_text(json.dumps(me))
    (run / "zz0001.mountpoints").write_text(f"{st.st_dev} {st.st_ino} {point}\n")

    netns.cleanup_instance("zz0001", {})
    assert point.is_dir()
    assert str(point) in (run / "zz0002.mountpoints").read_text()

    netns.cleanup_instance("zz0002", {})  # the last one removes it
    assert not point.exists()
    assert list(run.iterdir()) == []
