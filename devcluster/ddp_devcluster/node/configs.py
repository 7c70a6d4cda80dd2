"""What the real node's components are told: pure functions from a :class:`Layout` to files.

Nothing here starts a process or touches the machine; :mod:`ddp_devcluster.node.runtime` writes
these files and runs the components.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLUSTER_DOMAIN = "cluster.local"
PAUSE_IMAGE = "localhost/ddp-pause:1"
STORAGE_CLASS = "standard"  # kind's name for its default class, which the examples rely on
PROVISIONER = "rancher.io/local-path"
PROVISIONER_NAMESPACE = "local-path-storage"
SUBNETS = range(200, 250)  # 10.X.0.0/16 candidates, clear of the Service range


@dataclass(frozen=True)
class Layout:
    """Names and addresses of one node instance, all derived from its subnet number ``x``.

    The node lives in its own network namespace, joined to the host by one veth pair:
    ``10.x.255.1`` on the host's end (where the API server is reached), ``10.x.255.2`` the
    node's address (kubelet, CoreDNS). Its pods take ``10.x.0.2-254`` on a bridge whose
    gateway is ``10.x.0.1``; the host routes ``10.x.0.0/24`` through the node.
    """

    x: int
    state: Path  # everything the instance writes, removed when it stops
    name: str = "node-0"

    @property
    def netns(self) -> str:
        return f"ddpn-{self.x}"

    @property
    def host_link(self) -> str:
        return f"ddpn{self.x}"

    @property
    def host_ip(self) -> str:
        return f"10.{self.x}.255.1"

    @property
    def node_ip(self) -> str:
        return f"10.{self.x}.255.2"

    @property
    def link_cidr(self) -> str:
        return f"10.{self.x}.255.0/24"

    @property
    def pod_cidr(self) -> str:
        return f"10.{self.x}.0.0/24"

    @property
    def pod_gateway(self) -> str:
        return f"10.{self.x}.0.1"

    @property
    def bridge(self) -> str:
        return f"ddpbr{self.x}"

    @property
    def cgroup_root(self) -> str:
        """The cgroup (in every v1 hierarchy) under which the kubelet puts all pods."""
        return f"/ddp-node-{self.x}"

    def path(self, *parts: str) -> Path:
        return self.state.joinpath(*parts)

    @property
    def containerd_socket(self) -> Path:
        return self.path("containerd", "containerd.sock")


def pick_subnet(taken: set[int]) -> int:
    """The first subnet number no other instance (or leftover) uses."""
    for x in SUBNETS:
        if x not in taken:
            return x
    raise RuntimeError(f"every node subnet 10.{SUBNETS[0]}-{SUBNETS[-1]}.0.0/16 is in use")


CRI_PLUGINS = [
    "io.containerd.cri.v1.images",
    "io.containerd.cri.v1.runtime",
    "io.containerd.grpc.v1.cri",
]


def containerd_config(lay: Layout, runc: str, root: Path, cri: bool = True) -> str:
    """containerd 2.x (config version 3) with the CRI plugin, runc and the node's CNI.

    ``root`` (images, snapshots, metadata) may outlive the instance, so that images are
    imported once; ``cri=False`` is for tidying that root before the kubelet's pods use it.
    """
    cri_runtime = 'plugins."io.containerd.cri.v1.runtime"'
    runc_rt = f"{cri_runtime}.containerd.runtimes.runc"
    # NRI would listen on a fixed path that another containerd may own.
    disabled = ["io.containerd.nri.v1.nri", *([] if cri else CRI_PLUGINS)]
    return "\n".join(
        [
            "version = 3",
            f'root = "{root}"',
            f'state = "{lay.path("containerd", "state")}"',
            "disabled_plugins = [" + ", ".join(f'"{p}"' for p in disabled) + "]",
            "[grpc]",
            f'  address = "{lay.containerd_socket}"',
            "[ttrpc]",
            f'  address = "{lay.containerd_socket}.ttrpc"',
            '[plugins."io.containerd.cri.v1.images"]',
            '  snapshotter = "overlayfs"',
            '[plugins."io.containerd.cri.v1.images".pinned_images]',
            f'  sandbox = "{PAUSE_IMAGE}"',
            f"[{cri_runtime}]",
            # Pod network namespaces are mounted under the state folder, not /run/netns.
            "  netns_mounts_under_state_dir = true",
            # Containers may not lower their OOM score below containerd's own: this sandbox
            # lacks CAP_SYS_RESOURCE, and a pause container asks for -998.
            "  restrict_oom_score_adj = true",
            f"[{cri_runtime}.containerd]",
            '  default_runtime_name = "runc"',
            f"[{runc_rt}]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"[{runc_rt}.options]",
            f'  BinaryName = "{runc}"',
            f'  Root = "{lay.path("runc")}"',
            "  SystemdCgroup = false",
            f"[{cri_runtime}.cni]",
            '  bin_dirs = ["/usr/lib/cni"]',
            f'  conf_dir = "{lay.path("cni", "net.d")}"',
            "",
        ]
    )


def cni_config(lay: Layout) -> dict[str, Any]:
    """A bridge with host-local addresses (Debian's containernetworking-plugins) and portmap."""
    return {
        "cniVersion": "1.0.0",
        "name": "ddp-node",
        "plugins": [
            {
                "type": "bridge",
                "bridge": lay.bridge,
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": lay.pod_cidr, "gateway": lay.pod_gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(lay.path("cni", "ipam")),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(lay: Layout, ca_file: Path) -> dict[str, Any]:
    """KubeletConfiguration: cgroupfs on this machine's cgroup v1, pods under our own root."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,  # this kernel mounts cgroup v1 (hybrid)
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": lay.cgroup_root,
        "failSwapOn": False,
        "address": lay.node_ip,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "tlsCertFile": str(lay.path("pki", "kubelet.crt")),
        "tlsPrivateKeyFile": str(lay.path("pki", "kubelet.key")),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDomain": CLUSTER_DOMAIN,
        "clusterDNS": [lay.node_ip],
        "resolvConf": str(lay.path("resolv.conf")),
        "containerRuntimeEndpoint": f"unix://{lay.containerd_socket}",
        "podLogsDir": str(lay.path("pod-logs")),
        "staticPodPath": "",
        "serializeImagePulls": False,
        # The images are imported, not pulled: never collect them, and never evict for the
        # space a shared development disk has or lacks.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "protectKernelDefaults": False,
        "registerNode": True,
        "maxPods": 110,
        "shutdownGracePeriod": "0s",
    }


def kube_proxy_config(lay: Layout, kubeconfig: Path) -> dict[str, Any]:
    """kube-proxy in iptables mode, inside the node's network namespace."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "iptables",
        "clusterCIDR": lay.pod_cidr,
        "hostnameOverride": lay.name,
        "bindAddress": lay.node_ip,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        # Leave the conntrack table's size alone (a sysctl of the whole machine).
        "conntrack": {"maxPerCore": 0, "min": 0},
    }


def corefile(kubeconfig: Path) -> str:
    """CoreDNS serving cluster.local: Services, headless Services' pod names, reverse zones.

    Names outside the cluster are not forwarded: nothing beyond the node is reachable.
    """
    return (
        ".:53 {\n"
        "    errors\n"
        "    health 127.0.0.1:8080\n"
        "    ready 127.0.0.1:8181\n"
        f"    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{\n"
        f"        kubeconfig {kubeconfig}\n"
        "        pods insecure\n"
        "        ttl 5\n"
        "    }\n"
        "    cache 5\n"
        "    loadbalance\n"
        "}\n"
    )


def rbac_objects() -> list[dict[str, Any]]:
    """What the node's components may do: CoreDNS reads, the API server reaches kubelets,
    the provisioner manages volumes (cluster-admin: it is development infrastructure)."""

    def binding(name: str, role: str, user: str) -> dict[str, Any]:
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }

    coredns = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "ddp-node:coredns"},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["endpoints", "services", "pods", "namespaces"],
                "verbs": ["list", "watch"],
            },
            {
                "apiGroups": ["discovery.k8s.io"],
                "resources": ["endpointslices"],
                "verbs": ["list", "watch"],
            },
        ],
    }
    return [
        coredns,
        binding("ddp-node:coredns", "ddp-node:coredns", "system:coredns"),
        binding(
            "ddp-node:apiserver-kubelet",
            "system:kubelet-api-admin",
            "kube-apiserver-kubelet-client",
        ),
        binding(
            "ddp-node:local-path-provisioner", "cluster-admin", "system:local-path-provisioner"
        ),
    ]


def provisioner_objects(helper_image: str) -> list[dict[str, Any]]:
    """The namespace, the default StorageClass and the helper pod's ConfigMap of
    local-path-provisioner: a claim is bound to a folder that a helper pod makes on the node."""
    helper_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "helper-pod"},
        "spec": {
            "containers": [
                {"name": "helper-pod", "image": helper_image, "imagePullPolicy": "Never"}
            ]
        },
    }
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": PROVISIONER_NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "local-path-provisioner", "namespace": PROVISIONER_NAMESPACE},
        },
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": STORAGE_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": PROVISIONER,
            "volumeBindingMode": "WaitForFirstConsumer",
            "reclaimPolicy": "Delete",
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "local-path-config", "namespace": PROVISIONER_NAMESPACE},
            "data": {
                "setup": '#!/bin/sh\nset -eu\nmkdir -m 0777 -p "$VOL_DIR"\n',
                "teardown": '#!/bin/sh\nset -eu\nrm -rf "$VOL_DIR"\n',
                "helperPod.yaml": json.dumps(helper_pod),
            },
        },
    ]


def provisioner_config(lay: Layout) -> dict[str, Any]:
    return {
        "nodePathMap": [
            {"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES", "paths": [str(lay.path("volumes"))]}
        ]
    }


def node_certificates(lay: Layout) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Client identities of the node's components: file stem -> (user, groups)."""
    return {
        "kubelet": (f"system:node:{lay.name}", ("system:nodes",)),
        "kube-proxy": ("system:kube-proxy", ()),
        "coredns": ("system:coredns", ()),
        "local-path-provisioner": ("system:local-path-provisioner", ()),
    }
