"""The pure half of the pod and Service caches: which jobs a watch event or a LIST changes."""

from __future__ import annotations

from typing import Any

from ddp_operator import informer, render, reports
from ddp_operator.planner import views


def pod(name: str, job: str | None = "a", phase: str = "Pending", ip: str = "") -> dict[str, Any]:
    labels = {render.LABEL_ROLE: "worker", render.LABEL_INDEX: "0"}
    if job is not None:
        labels[render.LABEL_JOB] = job
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": f"u-{name}", "labels": labels},
        "status": {"phase": phase, "podIP": ip},
    }


def cache() -> informer.Cache[views.PodView]:
    return informer.Cache(render.LABEL_JOB, views.view)


def test_an_event_reports_its_job_only_when_what_the_planner_reads_changed() -> None:
    c = cache()
    assert c.apply("ADDED", pod("a-node-0")) == {("ns", "a")}
    # An IP changes nothing the planner reads: no reconcile.
    assert c.apply("MODIFIED", pod("a-node-0", ip="10.0.0.2")) == set()
    assert c.apply("MODIFIED", pod("a-node-0", phase="Running")) == {("ns", "a")}
    assert [v.phase for v in c.get(("ns", "a"))] == ["Running"]
    assert c.apply("DELETED", pod("a-node-0", phase="Running")) == {("ns", "a")}
    assert c.get(("ns", "a")) == [] and len(c) == 0 and c.by_job == {}
    assert c.apply("DELETED", pod("a-node-0")) == set()  # already gone


def test_a_pod_relabelled_to_another_job_or_to_none_leaves_its_old_job() -> None:
    c = cache()
    c.apply("ADDED", pod("p"))
    assert c.apply("MODIFIED", pod("p", job="b")) == {("ns", "a"), ("ns", "b")}
    assert set(c.kept(("ns", "a"))) == set() and set(c.kept(("ns", "b"))) == {"p"}
    assert c.apply("MODIFIED", pod("p", job=None)) == {("ns", "b")}
    assert len(c) == 0


def test_a_relist_reports_exactly_the_jobs_that_differ() -> None:
    c = cache()
    for p in (pod("a-0"), pod("b-0", job="b"), pod("c-0", job="c")):
        c.apply("ADDED", p)
    # During a gap in the watch: a-0 went Running, b-0 was deleted, d-0 appeared, c-0 unchanged.
    listed = [pod("a-0", phase="Running"), pod("c-0", job="c"), pod("d-0", job="d")]
    assert c.replace(listed) == {("ns", "a"), ("ns", "b"), ("ns", "d")}
    assert sorted(c.job_of) == [("ns", "a-0"), ("ns", "c-0"), ("ns", "d-0")]
    assert c.replace(listed) == set()


def test_a_pod_that_leaves_is_told_as_it_was_last() -> None:
    gone: list[tuple[tuple[str, str], str, str]] = []
    c = informer.Cache(
        render.LABEL_JOB, views.view, removed=lambda key, v: gone.append((key, v.name, v.phase))
    )
    for p in (pod("a-0"), pod("b-0", job="b"), pod("c-0", job="c")):
        c.apply("ADDED", p)
    c.apply("DELETED", pod("a-0", phase="Succeeded"))  # the deleted object's last state
    c.apply("MODIFIED", pod("b-0", job=None))  # no longer any job's
    c.replace([pod("d-0", job="d")])  # c-0 went during a gap in the watch
    assert gone == [
        (("ns", "a"), "a-0", "Succeeded"),
        (("ns", "b"), "b-0", "Pending"),
        (("ns", "c"), "c-0", "Pending"),
    ]


def test_progress_configmaps_belong_to_the_job_their_name_says_whatever_their_label() -> None:
    c = informer.Cache(render.LABEL_JOB, reports.record_of, reports.job_of)

    def configmap(name: str, label: str, text: str) -> dict[str, Any]:
        meta = {"namespace": "ns", "name": name, "labels": {render.LABEL_JOB: label}}
        return {"metadata": meta, "data": {"progress": text}}

    assert c.apply("ADDED", configmap("a-progress", "a", "{}")) == {("ns", "a")}
    # Relabelled as job b's by the pod that may patch it: still a's, and only a's.
    assert c.apply("MODIFIED", configmap("a-progress", "b", '{"step": 1}')) == {("ns", "a")}
    assert c.get(("ns", "b")) == [] and c.get(("ns", "a"))[0].text == '{"step": 1}'
    assert c.apply("ADDED", configmap("own-script", "a", "x")) == set()  # not a progress map
    assert c.replace([configmap("a-progress", "zzz", '{"step": 1}')]) == set()


def machine(name: str, ready: str = "True", heartbeat: str = "") -> dict[str, Any]:
    cond = {"type": "Ready", "status": ready, "lastTransitionTime": "2026-01-01T11:00:00Z"}
    return {
        "metadata": {"name": name},
        "status": {"conditions": [{**cond, "lastHeartbeatTime": heartbeat}]},
    }


def test_machines_report_a_node_only_when_its_readiness_changed() -> None:
    m = informer.ByName(views.machine_view)
    assert m.apply("ADDED", machine("m1")) == {("", "m1")}
    assert m.apply("MODIFIED", machine("m1", heartbeat="11:00:10")) == set()  # a heartbeat
    assert m.apply("MODIFIED", machine("m1", "Unknown")) == {("", "m1")}
    assert m.by_name["m1"].ready == "Unknown"
    assert m.replace([machine("m2")]) == {("", "m1"), ("", "m2")}
    assert set(m.by_name) == {"m2"}
    assert m.apply("DELETED", machine("m2")) == {("", "m2")} and not m.by_name
