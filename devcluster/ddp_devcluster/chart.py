"""``helm upgrade --install`` of the project's chart with the images this machine built (the
kind cluster of `make up`, `make demo` and the cluster suite; bench/node_loss.py)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from .build import binary
from .operator_process import NAMESPACE, REPO

CHART = REPO / "helm" / "ddp-operator"
# DDP_NODE_LOST_GRACE_S on kind: its kubelets renew their Lease every 2.5 s (kind/cluster-4.yaml),
# so 12 s of silence is four renewals missed, where the chart's default 30 s waits for the
# default 10 s renewals.
NODE_LOST_GRACE_S = 12.0


def helm_install_args(
    operator_ref: str, trainer_ref: str, pull_policy: str, kueue: bool = False
) -> list[str]:
    """``helm upgrade --install`` of the chart with these images: installs it, or moves an
    installed release to these images and values (pure). The chart takes its objects back from
    whoever changed them since (``--force-conflicts``): the end-to-end stack applies
    ``manifests/``' ClusterRole and admission policy, of the same names, with kubectl, and
    helm's server-side apply then refused `make up` on a cluster `make e2e-kind` had used."""
    repo, tag = operator_ref.rsplit(":", 1)
    return [
        "upgrade", "--install", "ddp-operator", str(CHART), "--namespace", NAMESPACE,
        "--create-namespace", "--set", f"image.repository={repo}", "--set", f"image.tag={tag}",
        "--set", f"image.pullPolicy={pull_policy}", "--set", f"trainerImage={trainer_ref}",
        "--set", "settings.backoffBaseSeconds=2", "--set", f"kueue.enabled={str(kueue).lower()}",
        "--set", f"settings.nodeLostGraceSeconds={NODE_LOST_GRACE_S:g}",
        "--force-conflicts", "--wait", "--timeout", "5m",
    ]  # fmt: skip


def helm() -> str:
    return shutil.which("helm") or str(binary("helm", "helm"))


def install_chart(
    kubeconfig: Path,
    operator_ref: str,
    trainer_ref: str,
    pull_policy: str,
    kueue: bool = False,
    values: Sequence[str] = (),
) -> str:
    """Installs or upgrades the release; ``values`` are more ``--set`` pairs (``key=value``)."""
    argv = [helm(), "--kubeconfig", str(kubeconfig)]
    argv += helm_install_args(operator_ref, trainer_ref, pull_policy, kueue)
    argv += [a for v in values for a in ("--set", v)]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"helm install failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return proc.stdout
