"""The kind cluster's pure parts: the node image's containerd config, kind's storage manifest,
kubeadm's image list, the image key, readiness, the registry's config, a gzipped archive."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from ddp_devcluster.archive import docker_archive, tar_dir
from ddp_devcluster.kind import registry
from ddp_devcluster.kind.cluster import node_count, ready_names
from ddp_devcluster.kind.nodeimage import (
    PAUSE_REF,
    containerd_config,
    control_plane_images,
    input_key,
    storage_manifest,
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
