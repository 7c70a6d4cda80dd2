"""The kind cluster's pure parts: the node image's containerd config, kind's storage manifest,
kubeadm's image list, the image key, the trainer's dependency layers, readiness, the
registry's config, a gzipped archive."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from ddp_devcluster.archive import docker_archive, tar_dir
from ddp_devcluster.kind import cluster, registry
from ddp_devcluster.kind.cluster import (
    go_duration_s,
    heard_within,
    node_count,
    pulled_s,
    ready_names,
    rendered_config,
)
from ddp_devcluster.kind.nodeimage import (
    PAUSE_REF,
    PRELOAD_PATH,
    SHARED_CLASS,
    SHARED_PATH,
    chain_id,
    containerd_config,
    control_plane_images,
    dependency_image,
    dependency_layers,
    input_key,
    storage_manifest,
    with_shared_class,
)

KIND_CONFIG = """# explicitly use v2 config format
version = 2

[proxy_plugins]
# fuse-overlayfs is used for rootless
[proxy_plugins."fuse-overlayfs"]
  type = "snapshot"
  address = "/run/containerd-fuse-overlayfs.sock"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  restrict_oom_score_adj = false
"""


def test_containerd_config_restricts_oom_score_adj_and_reads_the_registry_hosts() -> None:
    out = containerd_config(KIND_CONFIG)
    assert "restrict_oom_score_adj = true" in out
    assert "fuse-overlayfs" not in out and "[proxy_plugins]" not in out
    assert f'sandbox_image = "{PAUSE_REF}"' in out
    assert 'config_path = "/etc/containerd/certs.d"' in out


def test_containerd_config_refuses_a_config_of_another_shape() -> None:
    with pytest.raises(ValueError, match="changed shape"):
        containerd_config("version = 3\n")


def test_storage_manifest_substitutes_kinds_image_constants() -> None:
    go = (
        'const storageProvisionerImage = "docker.io/kindest/p:v1"\n'
        'const storageHelperImage = "docker.io/kindest/h:v2"\n'
        "const defaultStorageManifest = `\n"
        "image: ` + storageProvisionerImage + `\n"
        "helper: ` + storageHelperImage + `\n"
        "`\n"
    )
    text, refs = storage_manifest(go)
    assert text == "image: docker.io/kindest/p:v1\nhelper: docker.io/kindest/h:v2\n"
    assert refs == {"provisioner": "docker.io/kindest/p:v1", "helper": "docker.io/kindest/h:v2"}


def test_control_plane_images_are_keyed_by_component() -> None:
    listed = [
        "registry.k8s.io/kube-apiserver:v1.36.3",
        "registry.k8s.io/kube-controller-manager:v1.36.3",
        "registry.k8s.io/kube-scheduler:v1.36.3",
        "registry.k8s.io/kube-proxy:v1.36.3",
        "registry.k8s.io/coredns/coredns:v1.14.2",
        "registry.k8s.io/pause:3.10.2",
        "registry.k8s.io/etcd:3.6.8-0",
    ]
    images = control_plane_images(listed)
    assert images["coredns"] == "registry.k8s.io/coredns/coredns:v1.14.2"
    assert images["etcd"] == "registry.k8s.io/etcd:3.6.8-0"
    with pytest.raises(ValueError, match="expected"):
        control_plane_images(listed[:-1])


# The trainer image's history as podman shows it (2026-11-27): the base, uv and the lock
# copied, the venv and the user made by RUN steps, then the code copied.
TRAINER_HISTORY = [
    {"created_by": "/bin/sh -c #(nop) ADD file:03d8 in /"},
    {"created_by": "/bin/sh -c #(nop) ENV TORCH_BACKEND=cpu", "empty_layer": True},
    {"created_by": "/bin/sh -c #(nop) COPY file:d0d6 in /usr/local/bin/uv"},
    {"created_by": "/bin/sh -c #(nop) ENV UV_NO_CACHE=1", "empty_layer": True},
    {"created_by": "/bin/sh -c #(nop) COPY file:a08a in /tmp/trainer.lock"},
    {"created_by": "/bin/sh -c #(nop) ARG TORCH_SOURCE", "empty_layer": True},
    {"created_by": "|1 TORCH_SOURCE=pypi /bin/sh -c uv venv --python 3.11 /opt/venv"},
    {"created_by": "|1 TORCH_SOURCE=pypi /bin/sh -c useradd --create-home trainer"},
    {"created_by": "/bin/sh -c #(nop) COPY dir:743b in /opt/app/ddp_api"},
    {"created_by": "/bin/sh -c #(nop) COPY dir:bee7 in /opt/app/ddp_trainer"},
    {"created_by": "/bin/sh -c #(nop) ENV PATH=/opt/venv/bin:$PATH", "empty_layer": True},
    {"created_by": '/bin/sh -c #(nop) CMD ["python"]', "empty_layer": True},
]


def test_the_dependency_layers_end_with_the_last_run_step() -> None:
    assert dependency_layers(TRAINER_HISTORY) == 5  # base, uv, lock, venv, user; not the code
    # a code-only change keeps them; another RUN after the code would take the code in
    more = [*TRAINER_HISTORY, {"created_by": "/bin/sh -c python -m compileall /opt/app"}]
    assert dependency_layers(more) == 8
    with pytest.raises(ValueError, match="RUN"):
        dependency_layers(TRAINER_HISTORY[:1])


def test_chain_id_is_the_oci_chain_id() -> None:
    a, b, c = (f"sha256:{x * 64}" for x in "abc")
    assert chain_id([a]) == a
    ab = "sha256:" + hashlib.sha256(f"{a} {b}".encode()).hexdigest()
    assert chain_id([a, b]) == ab
    assert chain_id([a, b, c]) == "sha256:" + hashlib.sha256(f"{ab} {c}".encode()).hexdigest()
    assert chain_id([a, b]) != chain_id([b, a])


def test_the_dependency_image_has_the_first_layers_and_their_history() -> None:
    diff_ids = [f"sha256:{i}" for i in range(7)]
    layers = [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": d, "size": 1}
              for d in diff_ids]  # fmt: skip
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["PATH=/opt/venv/bin"], "Cmd": ["python"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": TRAINER_HISTORY,
    }
    man, cfg = dependency_image({"layers": layers}, config, 5)
    assert man["layers"] == layers[:5]
    assert cfg["rootfs"] == {"type": "layers", "diff_ids": diff_ids[:5]}
    assert cfg["history"] == TRAINER_HISTORY[:8]  # up to the useradd step
    assert cfg["config"] == {} and (cfg["architecture"], cfg["os"]) == ("amd64", "linux")


def test_the_dependency_layout_links_the_first_layers_under_the_preload_name(
    tmp_path: Path,
) -> None:
    from ddp_devcluster.kind.nodeimage import PRELOAD_REPO, _dependency_layout

    saved = tmp_path / "saved"
    blobs = saved / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return f"sha256:{digest}"

    diff_ids = [put(f"layer {i}".encode()) for i in range(7)]
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": TRAINER_HISTORY,
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"digest": put(json.dumps(config).encode())},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": d,
                    "size": 7} for d in diff_ids],
    }  # fmt: skip
    index = {"schemaVersion": 2, "manifests": [{"digest": put(json.dumps(manifest).encode())}]}
    (saved / "index.json").write_text(json.dumps(index))

    out = tmp_path / "layout"
    assert _dependency_layout(saved, out, 5) == diff_ids[:5]
    desc = json.loads((out / "index.json").read_text())["manifests"][0]
    name = chain_id(diff_ids[:5]).removeprefix("sha256:")[:12]
    assert desc["annotations"]["org.opencontainers.image.ref.name"] == f"{PRELOAD_REPO}:{name}"
    got = out / "blobs" / "sha256"
    man = json.loads((got / desc["digest"].removeprefix("sha256:")).read_bytes())
    assert [layer["digest"] for layer in man["layers"]] == diff_ids[:5]
    cfg = json.loads((got / man["config"]["digest"].removeprefix("sha256:")).read_bytes())
    assert cfg["rootfs"]["diff_ids"] == diff_ids[:5]
    for d in diff_ids[:5]:  # linked, not copied
        assert (got / d[7:]).stat().st_ino == (blobs / d[7:]).stat().st_ino
    assert not (got / diff_ids[5][7:]).exists()


def test_input_key_changes_with_any_input_and_not_with_order() -> None:
    a = input_key({"x": b"1", "y": b"2"})
    assert a == input_key({"y": b"2", "x": b"1"})
    assert a != input_key({"x": b"1", "y": b"3"})
    assert a != input_key({"x": b"1", "z": b"2"})


def test_ready_names_and_node_count() -> None:
    def node(name: str, ready: str) -> dict:
        conditions = [
            {"type": "MemoryPressure", "status": "False"},
            {"type": "Ready", "status": ready},
        ]
        return {"metadata": {"name": name}, "status": {"conditions": conditions}}

    listing = {"items": [node("a", "True"), node("b", "False"), {"metadata": {"name": "c"}}]}
    assert ready_names(listing) == ["a"]
    config = Path(__file__).resolve().parents[2] / "kind" / "cluster-4.yaml"
    assert node_count(config.read_text()) == 4


def test_registry_config_serves_plain_http_from_the_data_folder(tmp_path: Path) -> None:
    import yaml

    cfg = yaml.safe_load(registry.config(tmp_path / "data"))
    assert cfg["http"]["addr"] == f"0.0.0.0:{registry.PORT}"
    assert cfg["storage"]["filesystem"]["rootdirectory"] == str(tmp_path / "data")


def test_a_compressed_archive_of_a_directory_keeps_links_and_the_uncompressed_diff_id(
    tmp_path: Path,
) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "busybox").write_bytes(b"\x7fELF")
    (tmp_path / "bin" / "sh").symlink_to("busybox")
    layer = tar_dir(tmp_path)
    data = docker_archive(["x/y:1"], layer, ["/bin/sh"], compress=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        [entry] = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
        config = json.loads(tar.extractfile(entry["Config"]).read())  # type: ignore[union-attr]
        stored = tar.extractfile(entry["Layers"][0]).read()  # type: ignore[union-attr]
    assert gzip.decompress(stored) == layer
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
    with tarfile.open(fileobj=io.BytesIO(layer)) as inner:
        assert inner.getmember("bin/sh").issym() and inner.getmember("bin/sh").linkname == "busybox"
        assert inner.getmember("bin/busybox").uid == 0 and inner.getmember("bin").mtime == 0


KIND_STORAGE = """apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
provisioner: rancher.io/local-path
---
kind: ConfigMap
apiVersion: v1
metadata:
  name: local-path-config
  namespace: local-path-storage
data:
  config.json: |-
    {
            "nodePathMap":[
            {
                    "node":"DEFAULT_PATH_FOR_NON_LISTED_NODES",
                    "paths":["/var/local-path-provisioner"]
            }
            ]
    }
  setup: |-
    #!/bin/sh
"""


def test_the_shared_class_keeps_kinds_node_local_paths_and_adds_a_shared_path() -> None:
    import yaml

    docs = list(yaml.safe_load_all(with_shared_class(KIND_STORAGE)))
    config = json.loads(docs[1]["data"]["config.json"])
    assert config == {
        "storageClassConfigs": {
            "standard": {
                "nodePathMap": [
                    {
                        "node": "DEFAULT_PATH_FOR_NON_LISTED_NODES",
                        "paths": ["/var/local-path-provisioner"],
                    }
                ]
            },
            SHARED_CLASS: {"sharedFileSystemPath": SHARED_PATH},
        }
    }
    assert docs[1]["data"]["setup"] == "#!/bin/sh"
    assert docs[2]["kind"] == "StorageClass" and docs[2]["metadata"]["name"] == SHARED_CLASS
    assert docs[2]["provisioner"] == docs[0]["provisioner"]
    with pytest.raises(ValueError, match="changed shape"):
        with_shared_class("data:\n  other: x\n")


def test_every_node_of_the_rendered_config_mounts_the_shared_and_preload_folders(
    tmp_path: Path,
) -> None:
    import yaml

    config = Path(__file__).resolve().parents[2] / "kind" / "cluster-4.yaml"
    out = yaml.safe_load(
        rendered_config(config.read_text(), tmp_path / "shared", tmp_path / "preload")
    )
    assert len(out["nodes"]) == 4
    for node in out["nodes"]:
        assert node["extraMounts"] == [
            {"hostPath": str(tmp_path / "shared"), "containerPath": SHARED_PATH},
            {"hostPath": str(tmp_path / "preload"), "containerPath": PRELOAD_PATH,
             "readOnly": True},
        ]  # fmt: skip
    assert out["kubeadmConfigPatches"] == yaml.safe_load(config.read_text())["kubeadmConfigPatches"]


def test_registry_refs_follow_the_image_id() -> None:
    ref = registry.remote_ref("ghcr.io/ddp-operator/trainer:0.1.0", "sha256:" + "ab12" * 16)
    assert ref == f"{registry.HOST}/ddp-operator/trainer:0.1.0-ab12ab12ab12"
    assert (
        registry.remote_ref("trainer:dev", "cd34" * 16)
        == f"{registry.HOST}/trainer:dev-cd34cd34cd34"
    )


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("41.2s", 41.2), ("1m2.5s", 62.5), ("812ms", 0.812), ("1h0m0s", 3600.0)],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert go_duration_s(text) == pytest.approx(seconds)


def test_pull_time_from_kubelets_event() -> None:
    pulled = (
        'Successfully pulled image "localhost:5001/t:1" in 41.2s (41.3s including waiting).'
        " Image size: 5123456789 bytes."
    )
    assert pulled_s(pulled) == pytest.approx(41.2)
    assert pulled_s('Container image "localhost:5001/t:1" already present on machine') is None
    with pytest.raises(ValueError, match="Go duration"):
        go_duration_s("soon")


def test_this_machine_is_reached_at_the_ipv4_gateway_of_kind_s_dual_stack_network() -> None:
    network = {
        "name": "kind",
        "subnets": [
            {"subnet": "fc00:f853:ccd:e793::/64", "gateway": "fc00:f853:ccd:e793::1"},
            {"subnet": "10.89.0.0/24", "gateway": "10.89.0.1"},
        ],
    }
    assert cluster.ipv4_gateway(network) == "10.89.0.1"
    with pytest.raises(RuntimeError, match="no IPv4 gateway"):
        cluster.ipv4_gateway({"name": "v6", "subnets": network["subnets"][:1]})


def test_the_routes_to_the_pods_go_through_each_node_that_has_a_pod_cidr() -> None:
    nodes = {
        "items": [
            {
                "spec": {"podCIDR": "10.244.1.0/24"},
                "status": {"addresses": [{"type": "InternalIP", "address": "10.89.0.3"},
                                         {"type": "Hostname", "address": "ddp-worker"}]},
            },
            {"spec": {}, "status": {"addresses": [{"type": "InternalIP", "address": "10.89.0.4"}]}},
        ]
    }  # fmt: skip
    assert cluster.pod_routes(nodes) == [("10.244.1.0/24", "10.89.0.3")]


def test_a_machine_counts_as_heard_only_with_a_recent_lease_renewal() -> None:
    lease = {"spec": {"holderIdentity": "ddp-worker2", "renewTime": "2026-11-29T20:09:14.830609Z"}}
    at = 1795982954.830609  # 2026-11-29T20:09:14.830609Z
    assert heard_within(lease, at + 3, 10.0)
    assert heard_within(lease, at + 10, 10.0)
    assert not heard_within(lease, at + 12, 10.0)  # the operator's silence bound: not yet heard
    assert not heard_within({"spec": {"holderIdentity": "ddp-worker2"}}, at, 10.0)  # never
