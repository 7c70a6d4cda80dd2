"""Fixtures of the cluster suite: ``cluster`` (the chart installed on the cluster that
``DDP_CLUSTER`` names: see cluster_env.py; on kind, the session's ``kind_cluster`` of
tests/conftest.py) and ``ns`` (a restricted namespace per test)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from cluster_env import LOGS, PROVIDER, PROVIDERS, Cluster

from ddp_devcluster.kind import cluster as kind
from kind_env import KindCluster


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    if outcome.get_result().failed:
        item.cluster_failed = True  # type: ignore[attr-defined]


def _check_provider() -> None:
    if PROVIDER not in PROVIDERS:
        pytest.fail(f"DDP_CLUSTER={PROVIDER!r}: pick one of {', '.join(PROVIDERS)}")


if PROVIDER == "kind":

    @pytest.fixture(scope="session")
    def cluster(
        kind_cluster: KindCluster, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[Cluster]:
        yield from PROVIDERS["kind"](kind_cluster.kubeconfig, tmp_path_factory.mktemp("kind"))

else:

    @pytest.fixture(scope="session")
    def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
        _check_provider()
        yield from PROVIDERS[PROVIDER](None, tmp_path_factory.mktemp(f"cluster-{PROVIDER}"))


@pytest.fixture
def ns(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace enforcing the restricted Pod Security Standard. Its state and logs
    are collected when the test fails; it is deleted afterwards (the cores are few), without
    waiting: a passed test's jobs are over, so the little left to delete goes on beside the
    next test."""
    name = "e2e-" + request.node.name.removeprefix("test_")[:20].replace("_", "-").strip("-")
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
            },
        },
    }
    # A namespace of the same name that an earlier run is still deleting (it was deleted
    # without waiting) takes no new objects: wait until it has gone.
    cluster.until(f"namespace {name} of an earlier run gone", lambda: not (
        cluster.get("namespace", name, ns="").get("metadata", {}).get("deletionTimestamp")
    ), 300)  # fmt: skip
    cluster.k("apply", "-f", "-", input=json.dumps(namespace))
    if cluster.provider == "kind":  # every machine back from an earlier test's power-off or
        for node in cluster.get("nodes", ns="")["items"]:  # freeze, or its pods are evicted
            kind.wait_ready(cluster.kubeconfig, node["metadata"]["name"])  # mid-test
    yield name
    if getattr(request.node, "cluster_failed", False):
        cluster.collect(name, LOGS / request.node.name)
    cluster.k("delete", "namespace", name, "--wait=false", check=False)
