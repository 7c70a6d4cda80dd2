"""The operator told to watch some namespaces, as the Helm chart's ``watchNamespaces`` runs it.

Its ServiceAccount then holds the operator's ClusterRole only through a RoleBinding in each
watched namespace, so it may not list pods cluster-wide: it must watch the pods and Services
of each namespace instead, and leave every other namespace alone.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml

from ddp_devcluster.operator_process import NAMESPACE, OperatorProcess, install
from ddp_devcluster.plane import ControlPlane
from ddp_devcluster.polling import until

pytestmark = pytest.mark.controlplane
ACCOUNT = "ddp-operator-scoped"


def job(name: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "ddp.dev/v1alpha1",
            "kind": "DDPJob",
            "metadata": {"name": name},
            "spec": {
                "nodes": 2,
                "minNodes": 1,
                "maxNodes": 4,
                "checkpoint": {"volume": {"emptyDir": {}}},
            },
        }
    )


def test_an_operator_bound_in_one_namespace_runs_jobs_there_and_nowhere_else(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    cp = control_plane
    install(cp)
    watched, other = (f"{p}-{uuid.uuid4().hex[:8]}" for p in ("watched", "other"))
    for ns in (watched, other):
        cp.kubectl("create", "namespace", ns)
    cp.kubectl("create", "serviceaccount", ACCOUNT, "-n", NAMESPACE)
    cp.kubectl(
        "create", "rolebinding", ACCOUNT, "-n", watched,
        "--clusterrole=ddp-operator", f"--serviceaccount={NAMESPACE}:{ACCOUNT}",
    )  # fmt: skip
    # The Lease of leader election, in its own namespace, as the chart binds it there too.
    cp.kubectl(
        "create", "rolebinding", ACCOUNT, "-n", NAMESPACE,
        "--role=ddp-operator-leader-election", f"--serviceaccount={NAMESPACE}:{ACCOUNT}",
    )  # fmt: skip
    env = {"DDP_DEFAULT_IMAGE": "trainer:test"}
    with OperatorProcess(cp, tmp_path, env, [watched], ACCOUNT) as op:
        for ns in (other, watched):
            cp.kubectl("apply", "-n", ns, "-f", "-", input=job("scoped"))

        def pods(ns: str) -> list[str]:
            out = cp.kubectl("get", "pods", "-n", ns, "-o", "json").stdout
            return sorted(p["metadata"]["name"] for p in json.loads(out)["items"])

        until(
            "the watched namespace's job to get its pods",
            lambda: pods(watched) == ["scoped-node-0", "scoped-node-1", "scoped-rdzv"],
            timeout_s=30,
            detail=lambda: op.tail(20),
        )
        # Scaling is seen through the namespace's own pod watch.
        cp.kubectl("scale", "ddpjob/scoped", "--replicas=3", "-n", watched)
        until(
            "a third pod after the scale-up",
            lambda: "scoped-node-2" in pods(watched),
            timeout_s=30,
            detail=lambda: op.tail(20),
        )
        assert pods(other) == []  # never touched: outside the operator's namespaces
        # It may not read the cluster's admission policy for the trainers' account, so it never
        # grants that account: the job's pods run as an account of their own (fail closed).
        pod = json.loads(
            cp.kubectl("get", "pod", "scoped-node-0", "-n", watched, "-o", "json").stdout
        )
        assert pod["spec"]["serviceAccountName"] == "scoped-trainer"
        log = op.log.read_text()
        assert "watching the namespaces of DDPJobs one by one" in log
        assert f"watching pods and Services of namespace {watched}" in log
        assert "Traceback" not in log
        policy = "admission policy ddp-operator-trainer-progress not in force"
        assert f"{policy}: the operator cannot read it" in log
