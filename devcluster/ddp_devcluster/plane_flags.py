"""The flags each process of the embedded control plane (:mod:`~ddp_devcluster.plane`) starts
with, given the folder it works in (its certificates under ``pki/``, its kubeconfigs) and ports."""

from __future__ import annotations

from pathlib import Path

from .certs import SERVICE_CIDR


def etcd(workdir: Path, client_url: str, peer_port: int) -> list[str]:
    peer = f"http://127.0.0.1:{peer_port}"
    return [
        "--name=devcluster",
        f"--data-dir={workdir / 'etcd'}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=devcluster={peer}",
        "--unsafe-no-fsync",  # throwaway data: durability costs seconds per test
        "--log-level=warn",
    ]


def kube_apiserver(
    workdir: Path, etcd_port: int, secure_port: int, audit_policy: Path, audit_log: Path
) -> list[str]:
    pki = workdir / "pki"
    return [
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={secure_port}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        # Reaching kubelets (pods/log): at the node's InternalIP, since node names
        # resolve nowhere here; their serving certificates verified against the CA.
        "--kubelet-preferred-address-types=InternalIP,Hostname",
        f"--kubelet-certificate-authority={pki / 'ca.crt'}",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        # Node: a real kubelet reads only what its own pods need (NodeRestriction).
        "--authorization-mode=Node,RBAC",
        "--anonymous-auth=false",
        f"--service-account-key-file={pki / 'sa.crt'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        "--profiling=false",
        "--event-ttl=1h",
        f"--audit-policy-file={audit_policy}",
        f"--audit-log-path={audit_log}",
        "--audit-log-format=json",
        "--v=1",
    ]


def _kube_client(workdir: Path, kubeconfig: str, secure_port: int) -> list[str]:
    """What kube-controller-manager and kube-scheduler share: one kubeconfig for all three
    uses, serving on loopback, no leader election."""
    config = workdir / f"{kubeconfig}.kubeconfig"
    return [
        f"--kubeconfig={config}",
        f"--authentication-kubeconfig={config}",
        f"--authorization-kubeconfig={config}",
        "--bind-address=127.0.0.1",
        f"--secure-port={secure_port}",
        "--leader-elect=false",
    ]


def kube_controller_manager(workdir: Path, secure_port: int) -> list[str]:
    return [
        *_kube_client(workdir, "controller-manager", secure_port),
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={workdir / 'pki' / 'sa.key'}",
        f"--root-ca-file={workdir / 'pki' / 'ca.crt'}",
        # The garbage collector and ServiceAccount controllers are what tests rely on;
        # the rest of the defaults stay on, as on a real cluster.
        "--controllers=*",
        "--concurrent-gc-syncs=5",
        "--v=1",
    ]


def kube_scheduler(workdir: Path, secure_port: int) -> list[str]:
    return [*_kube_client(workdir, "scheduler", secure_port), "--v=1"]


def kwok(workdir: Path, stages: Path, node_annotation: str, server_port: int) -> list[str]:
    return [
        f"--kubeconfig={workdir / 'kwok.kubeconfig'}",
        f"--config={stages}",
        f"--manage-nodes-with-annotation-selector={node_annotation}=fake",
        f"--server-address=127.0.0.1:{server_port}",
    ]
