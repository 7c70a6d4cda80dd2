"""Certificates and kubeconfigs for the embedded control plane (a throwaway CA per start)."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

# The first address of the Service range: in-cluster clients reach the API server as
# https://kubernetes.default.svc, which resolves to it, so the serving cert must name it.
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(cn: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    return x509.Name([*attrs, x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey, ca: bool
) -> x509.CertificateBuilder:
    """A certificate of ``key`` for ``subject``, valid from 5 minutes ago for 7 days, a CA's
    or not."""
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=7))
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )


def _key_usage(**granted: bool) -> x509.KeyUsage:
    """KeyUsage with the ``granted`` usages only (x509.KeyUsage wants all nine named)."""
    usages = ("digital_signature", "content_commitment", "key_encipherment",
              "data_encipherment", "key_agreement", "key_cert_sign", "crl_sign",
              "encipher_only", "decipher_only")  # fmt: skip
    return x509.KeyUsage(**{**dict.fromkeys(usages, False), **granted})


def make_ca() -> tuple[KeyPair, ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _key()
    name = _name("ddp-devcluster-ca")
    usage = _key_usage(digital_signature=True, key_cert_sign=True, crl_sign=True)
    cert = (
        _builder(name, name, key, ca=True)
        .add_extension(usage, critical=True)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _pem(key)), key, cert


def issue(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    cn: str,
    orgs: tuple[str, ...] = (),
    dns: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
) -> KeyPair:
    """A leaf certificate for a client (``orgs`` become RBAC groups) or a server (SANs)."""
    key = _key()
    server = bool(dns or ips)
    usage = x509.ExtendedKeyUsageOID.SERVER_AUTH if server else x509.ExtendedKeyUsageOID.CLIENT_AUTH
    builder = _builder(_name(cn, orgs), ca_cert.subject, key, ca=False).add_extension(
        x509.ExtendedKeyUsage([usage]), critical=False
    )
    if server:
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _pem(key))


def load_ca(cert_pem: bytes, key_pem: bytes) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A CA written by :func:`make_ca`, to issue more certificates with."""
    key = serialization.load_pem_private_key(key_pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an EC key (not made by make_ca)")
    return key, x509.load_pem_x509_certificate(cert_pem)


def service_account_keys() -> KeyPair:
    """The key pair that signs and verifies ServiceAccount tokens (public key as 'cert')."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pub = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return KeyPair(pub, _pem(key))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def kubeconfig(
    server: str, ca_pem: bytes, user: str, *, client: KeyPair | None = None, token: str = ""
) -> str:
    """A kubeconfig with everything embedded, so it can be copied anywhere."""
    creds: dict[str, str] = {}
    if client is not None:
        creds = {
            "client-certificate-data": _b64(client.cert_pem),
            "client-key-data": _b64(client.key_pem),
        }
    if token:
        creds["token"] = token
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "ddp-devcluster",
                    "cluster": {"server": server, "certificate-authority-data": _b64(ca_pem)},
                }
            ],
            "users": [{"name": user, "user": creds}],
            "contexts": [{"name": user, "context": {"cluster": "ddp-devcluster", "user": user}}],
            "current-context": user,
        },
        sort_keys=False,
    )


def write_pair(directory: Path, name: str, pair: KeyPair) -> tuple[Path, Path]:
    crt, key = directory / f"{name}.crt", directory / f"{name}.key"
    crt.write_bytes(pair.cert_pem)
    key.write_bytes(pair.key_pem)
    key.chmod(0o600)
    return crt, key


@dataclass(frozen=True)
class PlanePKI:
    """What the control plane keeps of its certificates once they are written."""

    ca_pem: bytes
    admin_cert: tuple[Path, Path]  # the admin client's (cert, key) files


def write_plane_pki(workdir: Path, server: str) -> PlanePKI:
    """A fresh CA and every certificate and key of the control plane under ``workdir/pki``; the
    kubeconfigs of the admin, controller-manager, scheduler and kwok in ``workdir``."""
    pki = workdir / "pki"
    pki.mkdir(exist_ok=True)
    ca, ca_key, ca_cert = make_ca()
    write_pair(pki, "ca", ca)
    serving = issue(
        ca_key,
        ca_cert,
        "kube-apiserver",
        dns=(
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ),
        ips=("127.0.0.1", KUBERNETES_SERVICE_IP),
    )
    write_pair(pki, "apiserver", serving)
    write_pair(pki, "sa", service_account_keys())
    clients = {
        "admin": ("kubernetes-admin", ("system:masters",)),
        "controller-manager": ("system:kube-controller-manager", ()),
        "scheduler": ("system:kube-scheduler", ()),
        "kwok": ("system:kwok-controller", ("system:masters",)),
    }
    for name, (cn, orgs) in clients.items():
        pair = issue(ca_key, ca_cert, cn, orgs)
        (workdir / f"{name}.kubeconfig").write_text(
            kubeconfig(server, ca.cert_pem, cn, client=pair)
        )
    # What the API server presents to kubelets (logs, exec), which check it against the CA.
    write_pair(
        pki,
        "apiserver-kubelet-client",
        issue(ca_key, ca_cert, "kube-apiserver-kubelet-client"),
    )
    admin = write_pair(
        pki,
        "admin-client",
        issue(ca_key, ca_cert, "kubernetes-admin", ("system:masters",)),
    )
    return PlanePKI(ca.cert_pem, admin)
