"""Kueue, the real one, as a process of this machine against a cluster's API (the embedded control
plane's or the kind cluster's; development and tests).

Its CRDs and webhook manifests come from the pinned module itself (``go mod download``, the way
``python -m ddp_devcluster build`` fetched it), never from copies in this repository. It runs with
the cluster's admin kubeconfig, a Configuration naming DDPJob as an external framework, no
internal certificate management, and a webhook serving certificate from a CA of its own. Its
webhooks for Kueue's own kinds are registered with ``clientConfig.url`` at this machine's address
as the API server reaches it (loopback for the embedded plane, the host's end of kind's network
for kind), so the API server reaches them without a Service; the webhooks of the job
integrations it is not asked to manage (batch Jobs, pods, ...) are left out.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ddp_api.contract import GROUP, KIND, VERSION

from . import certs, versions
from .managed import ManagedProcess, http_ok
from .paths import cache_dir
from .plane import MARKER_ENV, ClusterAPI, Process
from .plane import binary as plane_binary
from .procs import free_port

MODULE = "sigs.k8s.io/kueue"
EXTERNAL_FRAMEWORK = f"{KIND}.{VERSION}.{GROUP}"
NAMESPACE = "kueue-system"
API = "kueue.x-k8s.io/v1beta2"
METRICS_CERTS = Path("/etc/kueue/metrics/certs")
# The visibility API server (an aggregated API with a certificate of its own) is not needed.
FEATURE_GATES = ["--feature-gates=VisibilityOnDemand=false"]


CHART = Path(__file__).resolve().parents[2] / "helm" / "ddp-operator"


def operator_rbac(release: str, namespace: str) -> list[dict[str, Any]]:
    """The operator's ServiceAccount and RBAC as the chart renders them with kueue.enabled (the
    Role of its Lease, named ``release``, in ``namespace``, among them), and the release's
    ClusterRole and admission policy for the trainers' account (the operator of a release other
    than ddp-operator is told their name: DDP_TRAINER_POLICY)."""
    argv = [str(plane_binary("helm")), "template", release, str(CHART), "--namespace", namespace]
    argv += ["--set", "kueue.enabled=true"]
    for template in ("serviceaccount.yaml", "rbac.yaml", "leader-election.yaml",
                     "trainer-progress.yaml"):  # fmt: skip
        argv += ["--show-only", f"templates/{template}"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def queue_objects(
    namespace: str,
    local_queue: str,
    cluster_queue: str,
    flavor: str,
    quota: Mapping[str, int | str],
    node_labels: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """A ResourceFlavor, a ClusterQueue with ``quota`` (resource -> nominal quota) of it for
    the jobs of ``namespace``, preempting lower priorities within it, and the LocalQueue
    ``local_queue`` of ``namespace`` in front of it."""
    groups = [
        {
            "coveredResources": list(quota),
            "flavors": [
                {
                    "name": flavor,
                    "resources": [{"name": r, "nominalQuota": q} for r, q in quota.items()],
                }
            ],
        }
    ]
    selector = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    return [
        {
            "apiVersion": API,
            "kind": "ResourceFlavor",
            "metadata": {"name": flavor},
            **({"spec": {"nodeLabels": dict(node_labels)}} if node_labels else {}),
        },
        {
            "apiVersion": API,
            "kind": "ClusterQueue",
            "metadata": {"name": cluster_queue},
            "spec": {
                "namespaceSelector": selector,
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": groups,
            },
        },
        {
            "apiVersion": API,
            "kind": "LocalQueue",
            "metadata": {"name": local_queue, "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue},
        },
    ]


def binary() -> Path:
    path = cache_dir() / "bin" / f"kueue-{versions.KUEUE}" / "kueue"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `make binaries` first")
    return path


def module_dir() -> Path:
    """The pinned Kueue module's source in the Go module cache (downloaded if need be)."""
    with tempfile.TemporaryDirectory() as cwd:
        out = subprocess.run(
            ["go", "mod", "download", "-json", f"{MODULE}@v{versions.KUEUE}"],
            cwd=cwd,
            env={**os.environ, "GOFLAGS": "-mod=mod"},
            capture_output=True,
            text=True,
            check=True,
        )
    return Path(json.loads(out.stdout)["Dir"])


def configuration(
    webhook_port: int, health_port: int, cert_dir: Path, webhook_host: str = "127.0.0.1"
) -> dict:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2), its webhooks served on
    ``webhook_host``."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "host": webhook_host, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "integrations": {"frameworks": [], "externalFrameworks": [EXTERNAL_FRAMEWORK]},
    }


def webhook_configurations(
    manifests: str, port: int, ca_pem: bytes, host: str = "127.0.0.1"
) -> list[dict[str, Any]]:
    """Kueue's webhook configurations, only the webhooks of its own kinds, each pointed at
    ``https://host:port<its path>`` and trusting ``ca_pem``."""
    out = []
    for doc in yaml.safe_load_all(manifests):
        if not doc or not doc.get("kind", "").endswith("WebhookConfiguration"):
            continue
        hooks = []
        for hook in doc.get("webhooks") or []:
            groups = {g for rule in hook.get("rules") or [] for g in rule.get("apiGroups") or []}
            if groups != {"kueue.x-k8s.io"}:
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {
                "url": f"https://{host}:{port}{path}",
                "caBundle": base64.b64encode(ca_pem).decode(),
            }
            hooks.append(hook)
        doc["metadata"] = {"name": f"kueue-{doc['metadata']['name']}"}
        doc["webhooks"] = hooks
        out.append(doc)
    return out


@dataclass
class KueueProcess(ManagedProcess):
    """``kueue`` (the controller manager) in a child process; ``start()`` installs its CRDs."""

    plane: ClusterAPI
    workdir: Path
    process: Process | None = None
    startup_s: float = 0.0
    name = "kueue"

    @property
    def log(self) -> Path:
        return self.workdir / "kueue.log"

    def start(self, timeout_s: float = 180.0) -> KueueProcess:
        t0 = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        source = module_dir()
        bases = source / "config" / "components" / "crd" / "bases"
        self.plane.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", str(bases), timeout=180
        )
        crds = [f"crd/{p.stem.split('_', 1)[1]}.kueue.x-k8s.io" for p in sorted(bases.glob("*"))]
        self.plane.kubectl("wait", "--for=condition=Established", *crds, "--timeout=120s")
        self.plane.kubectl("create", "namespace", NAMESPACE, check=False)

        ca, ca_key, ca_cert = certs.make_ca()  # for its serving certificates only
        host = self.plane.webhook_host
        cert_dir = self.workdir / "certs"
        cert_dir.mkdir(exist_ok=True)
        serving = certs.issue(ca_key, ca_cert, "kueue-webhook", dns=("localhost",), ips=(host,))
        (cert_dir / "tls.crt").write_bytes(serving.cert_pem)
        (cert_dir / "tls.key").write_bytes(serving.key_pem)
        self.webhook_port, self.health_port = free_port(), free_port()
        config = self.workdir / "config.yaml"
        config.write_text(
            yaml.safe_dump(configuration(self.webhook_port, self.health_port, cert_dir, host))
        )
        env = {
            **os.environ,
            "KUBECONFIG": str(self.plane.kubeconfig),
            MARKER_ENV: self.plane.marker,
        }
        argv = self._with_metrics_cert(
            [str(binary()), f"--config={config}", "--zap-log-level=2", *FEATURE_GATES],
            ca_key,
            ca_cert,
        )
        self.launch(argv, env)
        self.wait_for(self._ready, "kueue /readyz", timeout_s, poll_s=0.3)

        manifests = (source / "config" / "components" / "webhook" / "manifests.yaml").read_text()
        for hook in webhook_configurations(manifests, self.webhook_port, ca.cert_pem, host):
            self.plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(hook))
        self.wait_for(
            self._webhook_answers, "Kueue's webhooks through the API server", 60, poll_s=0.3
        )
        self.startup_s = time.monotonic() - t0
        return self

    def _with_metrics_cert(self, argv: list[str], ca_key: Any, ca_cert: Any) -> list[str]:
        """``argv`` run where Kueue finds a metrics certificate at METRICS_CERTS.

        With internal certificate management off, Kueue reads one from that fixed path (its
        chart mounts a Secret there) even when, as here, its metrics server is off. Rather than
        write into this machine's /etc, Kueue gets a private mount namespace in which /etc is
        an overlay holding that certificate (needs root, as the kind cluster does).
        """
        if (METRICS_CERTS / "tls.crt").is_file():
            return argv
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            raise RuntimeError(
                f"Kueue needs a certificate at {METRICS_CERTS} (internal certificate management"
                " is off): run as root, or put a tls.crt and tls.key there"
            )
        upper, work = self.workdir / "etc-upper", self.workdir / "etc-work"
        certs_dir = upper / METRICS_CERTS.relative_to("/etc")
        certs_dir.mkdir(parents=True, exist_ok=True)
        work.mkdir(exist_ok=True)
        pair = certs.issue(ca_key, ca_cert, "kueue-metrics", dns=("localhost",), ips=("127.0.0.1",))
        (certs_dir / "tls.crt").write_bytes(pair.cert_pem)
        (certs_dir / "tls.key").write_bytes(pair.key_pem)
        mount = f"mount -t overlay overlay -o lowerdir=/etc,upperdir={upper},workdir={work} /etc"
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                f'{mount} && exec "$@"', "sh", *argv]  # fmt: skip

    def _ready(self) -> bool:
        return http_ok(f"http://127.0.0.1:{self.health_port}/readyz", timeout_s=2)

    def _webhook_answers(self) -> bool:
        """A server-side dry run of a ResourceFlavor passes the mutating and validating hooks."""
        flavor = {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": "probe"}}
        out = self.plane.kubectl(
            "create", "--dry-run=server", "-f", "-", input=json.dumps(flavor), check=False
        )
        return out.returncode == 0

    def stop(self) -> None:
        """Stops Kueue and removes its webhook configurations (they would refuse every request
        for Kueue's kinds with Kueue gone)."""
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            name = f"kueue-{kind.removesuffix('webhookconfiguration')}-webhook-configuration"
            self.plane.kubectl("delete", kind, name, "--ignore-not-found", check=False)
        super().stop()
