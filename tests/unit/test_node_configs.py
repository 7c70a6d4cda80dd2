"""The real node's pure parts: addresses, the components' configuration, the pause image."""

from __future__ import annotations

import hashlib
import io
import ipaddress
import json
import tarfile
from pathlib import Path

import pytest

from ddp_devcluster.archive import docker_archive, tar_members
from ddp_devcluster.node import configs
from ddp_devcluster.node.configs import Layout

LAY = Layout(x=201, state=Path("/var/lib/ddp-node/201"))


def test_addresses_of_one_instance_fit_together() -> None:
    pods = ipaddress.ip_network(LAY.pod_cidr)
    link = ipaddress.ip_network(LAY.link_cidr)
    assert ipaddress.ip_address(LAY.pod_gateway) in pods
    assert {ipaddress.ip_address(LAY.host_ip), ipaddress.ip_address(LAY.node_ip)} <= set(link)
    assert not pods.overlaps(link)
    # Clear of the Service range, for every subnet an instance may pick.
    services = ipaddress.ip_network("10.96.0.0/16")
    assert not any(
        ipaddress.ip_network(f"10.{x}.0.0/16").overlaps(services) for x in configs.SUBNETS
    )
    assert len({LAY.netns, LAY.host_link, LAY.bridge}) == 3 and len(LAY.host_link) <= 15


def test_pick_subnet_skips_taken_ones_and_says_when_none_is_left() -> None:
    assert configs.pick_subnet(set()) == 200
    assert configs.pick_subnet({200, 201}) == 202
    with pytest.raises(RuntimeError, match="every node subnet"):
        configs.pick_subnet(set(configs.SUBNETS))


def test_containerd_without_cri_for_tidying_and_with_it_for_pods() -> None:
    root = Path("/cache/node/containerd")
    with_cri = configs.containerd_config(LAY, "/usr/sbin/runc", root)
    without = configs.containerd_config(LAY, "/usr/sbin/runc", root, cri=False)
    assert f'root = "{root}"' in with_cri and f'state = "{LAY.state}/containerd/state"' in with_cri
    assert "restrict_oom_score_adj = true" in with_cri  # no CAP_SYS_RESOURCE here
    assert "netns_mounts_under_state_dir = true" in with_cri
    assert f'sandbox = "{configs.PAUSE_IMAGE}"' in with_cri

    def disabled(config: str) -> str:
        return next(line for line in config.splitlines() if line.startswith("disabled_plugins"))

    assert disabled(with_cri) == 'disabled_plugins = ["io.containerd.nri.v1.nri"]'
    assert all(f'"{p}"' in disabled(without) for p in configs.CRI_PLUGINS)


def test_pods_resolve_through_the_node_and_live_in_its_cgroup() -> None:
    kubelet = configs.kubelet_config(LAY, Path("/pki/ca.crt"))
    assert kubelet["clusterDNS"] == [LAY.node_ip] and kubelet["address"] == LAY.node_ip
    assert kubelet["cgroupRoot"] == LAY.cgroup_root and kubelet["failCgroupV1"] is False
    assert kubelet["authentication"]["anonymous"]["enabled"] is False
    cni = configs.cni_config(LAY)["plugins"][0]
    assert cni["bridge"] == LAY.bridge
    assert cni["ipam"]["ranges"] == [[{"subnet": LAY.pod_cidr, "gateway": LAY.pod_gateway}]]
    proxy = configs.kube_proxy_config(LAY, Path("/k"))
    assert proxy["clusterCIDR"] == LAY.pod_cidr and proxy["conntrack"]["maxPerCore"] == 0
    assert "kubernetes cluster.local in-addr.arpa ip6.arpa" in configs.corefile(Path("/k"))


def test_the_default_storage_class_is_local_path() -> None:
    objects = configs.provisioner_objects("python:3.11-slim-bookworm")
    sc = next(o for o in objects if o["kind"] == "StorageClass")
    assert sc["metadata"]["name"] == "standard" and sc["provisioner"] == configs.PROVISIONER
    assert sc["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"] == "true"
    cm = next(o for o in objects if o["kind"] == "ConfigMap")
    assert json.loads(cm["data"]["helperPod.yaml"])["spec"]["containers"][0]["image"] == (
        "python:3.11-slim-bookworm"
    )


def test_pause_archive_is_a_docker_archive_whose_config_names_its_layer() -> None:
    def archive() -> bytes:
        layer = tar_members({"pause": (b"\x7fELF...", 0o755)})
        return docker_archive(["localhost/x:1"], layer, ["/pause"], user="65535:65535")

    data = archive()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
        [entry] = manifest
        assert entry["RepoTags"] == ["localhost/x:1"]
        config_bytes = tar.extractfile(entry["Config"]).read()  # type: ignore[union-attr]
        layer = tar.extractfile(entry["Layers"][0]).read()  # type: ignore[union-attr]
    assert entry["Config"] == hashlib.sha256(config_bytes).hexdigest() + ".json"
    config = json.loads(config_bytes)
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
    assert config["config"]["Entrypoint"] == ["/pause"]
    with tarfile.open(fileobj=io.BytesIO(layer)) as inner:
        member = inner.getmember("pause")
        assert member.mode == 0o755 and member.mtime == 0
    assert config["config"]["User"] == "65535:65535"
    assert archive() == data  # reproducible
