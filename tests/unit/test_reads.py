"""Which ``kubectl get`` forms the harness reads in its own process, and what it reads for them
(the GETs themselves run against real API servers in tests/controlplane and the kind tiers)."""

from __future__ import annotations

import pytest

from ddp_devcluster.reads import RESOURCES, as_kubectl, route


def test_a_named_object_and_a_selected_list_are_one_get_each() -> None:
    job = route(("ddpjob", "digits"), "demo")
    assert job is not None and job.one
    assert job.path == "/apis/ddp.dev/v1alpha1/namespaces/demo/ddpjobs/digits"
    pods = route(("pods", "-l", "ddp.dev/job-name=digits"), "")
    assert pods is not None and not pods.one
    assert pods.path == "/api/v1/namespaces/default/pods"  # kubectl's default namespace
    assert pods.query == (("labelSelector", "ddp.dev/job-name=digits"),)
    events = route(("events", "--field-selector", "involvedObject.name=digits"), "demo")
    assert events is not None and events.query == (("fieldSelector", "involvedObject.name=digits"),)


def test_cluster_scoped_kinds_ignore_the_namespace() -> None:
    node = route(("nodes",), "demo")
    assert node is not None and node.path == "/api/v1/nodes"
    namespace = route(("namespace", "e2e-x"), "")
    assert namespace is not None and namespace.path == "/api/v1/namespaces/e2e-x"


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("deployments",),  # a kind it does not know
        ("pods", "-A"),  # any other flag
        ("pods", "--ignore-not-found"),
        ("pods", "-l"),  # a selector flag without its value
        ("pod", "a", "-l", "x=y"),  # a name and a label selector: kubectl's own error
        ("pod/a",),  # kind/name
    ],
)
def test_every_other_form_is_left_to_kubectl(args: tuple[str, ...]) -> None:
    assert route(args, "demo") is None


def test_a_list_reads_as_kubectl_prints_it() -> None:
    r = route(("pods",), "demo")
    assert r is not None
    body = {"kind": "PodList", "apiVersion": "v1", "items": [{"metadata": {"name": "a"}}]}
    listed = as_kubectl(r, body)
    assert listed["kind"] == "List"
    assert listed["items"] == [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"}}]
    jobs = route(("ddpjobs",), "demo")
    assert jobs is not None
    item = as_kubectl(jobs, {"items": [{"metadata": {"name": "j"}}]})["items"][0]
    assert (item["apiVersion"], item["kind"]) == ("ddp.dev/v1alpha1", "DDPJob")
    assert all(r.kind and r.plural for r in RESOURCES.values())
