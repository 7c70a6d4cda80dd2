"""The controller's bookkeeping (which status to believe, when to write it, expectations,
Events), its settings, and the API client's retry arithmetic."""

from __future__ import annotations

import datetime as dt

import pytest
from pydantic import ValidationError

from ddp_api.ddpjob import DDPJob, DDPJobSpec
from ddp_operator import bookkeeping, kube, render
from ddp_operator.planner.plan import PlanSettings, plan
from ddp_operator.settings import Settings


def test_retries_follow_retry_after_then_double_and_are_capped() -> None:
    assert kube.retry_delay_s(1, "2") == 2.0
    assert kube.retry_delay_s(1, "120") == 10.0  # a server's long wait is capped
    assert [kube.retry_delay_s(n, None) for n in (1, 2, 3)] == [0.1, 0.2, 0.4]
    assert kube.retry_delay_s(20, None) == 3.2
    assert kube.retry_delay_s(2, "soon") == 0.2  # unreadable: our own backoff


def test_our_last_status_write_wins_over_a_staler_watched_status() -> None:
    watched = {"phase": "Running", "restarts": 0, "startTime": "t", "progress": {"step": 9}}
    ours = {"phase": "Restarting", "restarts": 1, "startTime": None}
    merged = bookkeeping.merged(watched, ours)
    assert merged == {"phase": "Restarting", "restarts": 1, "progress": {"step": 9}}
    assert bookkeeping.merged(watched, None) == watched


def test_objects_go_to_their_collections() -> None:
    job = DDPJob.model_validate({"metadata": {"name": "j", "namespace": "team"}, "spec": {}})
    sa, _, rbac = render.render_trainer_identity(job)
    assert kube.path_of(rbac) == ("/apis/rbac.authorization.k8s.io/v1/namespaces/team/rolebindings")
    assert kube.path_of(sa) == "/api/v1/namespaces/team/serviceaccounts"
    assert kube.group_path("ddp.dev/v1alpha1", "team", "ddpjobs", "x") == (
        "/apis/ddp.dev/v1alpha1/namespaces/team/ddpjobs/x"
    )


def test_creates_stay_expected_until_watched_or_too_old() -> None:
    expected = {"j-node-0": 100.0, "j-node-1": 100.0, "j-rdzv": 50.0}
    assert bookkeeping.pending_creates(expected, {"j-node-0"}, now=110.0) == {"j-node-1": 100.0}
    assert bookkeeping.pending_creates(expected, set(), now=200.0) == {}


def test_status_writes_counted_failures_first_and_pod_counts_at_a_bounded_rate() -> None:
    assert bookkeeping.status_write(set(), 5.0) == (False, False, None)
    assert bookkeeping.status_write({"handledFailures", "restarts"}, 0.1) == (True, True, None)
    assert bookkeeping.status_write({"phase", "ready"}, 0.1) == (True, False, None)
    write, first, wait = bookkeeping.status_write({"ready", "readyNodes"}, 0.25)
    assert (write, first) == (False, False) and wait == pytest.approx(0.75)
    assert bookkeeping.status_write({"ready"}, 1.5) == (True, False, None)


def test_a_new_jobs_first_status_is_written_after_its_pods_and_a_counted_failure_before() -> None:
    job = DDPJob.model_validate(
        {"metadata": {"name": "j", "namespace": "ns", "uid": "u"}, "spec": {"nodes": 2}}
    )
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    first = plan(job, {}, [], now, PlanSettings(render.OperatorConfig(default_image="t")))
    assert first.status["handledFailures"] == [] and any(o["kind"] == "Pod" for o in first.create)
    diff = bookkeeping.status_diff({}, first.status)
    assert "handledFailures" not in diff and "phase" in diff
    assert bookkeeping.status_write(diff, 99.0) == (True, False, None)  # after the creates
    counted = bookkeeping.status_diff({"handledFailures": []}, {"handledFailures": ["p:1"]})
    assert bookkeeping.status_write(counted, 99.0) == (True, True, None)
    assert bookkeeping.status_diff({"handledFailures": ["p:1"]}, {"handledFailures": []}) == {
        "handledFailures"
    }


def test_an_unreadable_spec_fails_the_job_once_with_the_fields_named() -> None:
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    try:
        DDPJobSpec.model_validate({"nodes": 0})
    except ValidationError as error:
        p = bookkeeping.invalid_spec({"phase": "Running"}, error, now)
        again = bookkeeping.invalid_spec({"phase": "Failed"}, error, now)
    assert p.status["phase"] == "Failed" and p.status["completionTime"] == "2026-01-01T00:00:00Z"
    assert [r for _, r, m in p.events if "nodes" in m] == ["InvalidSpec"]
    assert again.status == {} and again.events == []


def test_an_event_names_the_job_it_is_about() -> None:
    job = {"name": "digits", "namespace": "team", "uid": "u-1"}
    now = dt.datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)
    e = bookkeeping.event_body(
        job, "Warning", "PodFailed", "x" * 2000, name="digits.1", now=now,
        component="ddp-operator", instance="pod-1", api_version="ddp.dev/v1alpha1", kind="DDPJob",
    )  # fmt: skip
    assert e["involvedObject"] == {
        "apiVersion": "ddp.dev/v1alpha1",
        "kind": "DDPJob",
        "name": "digits",
        "namespace": "team",
        "uid": "u-1",
    }
    assert e["metadata"] == {"name": "digits.1", "namespace": "team"}
    assert len(e["message"]) == 1024 and e["lastTimestamp"] == "2026-01-01T12:00:00.123456Z"


def test_a_counted_failure_s_events_are_named_by_what_they_tell_of() -> None:
    """The same failures planned by two replicas give the same Event names; other failures,
    another job (the same name made again) or another Event of the plan give others."""
    job = {"name": "digits", "namespace": "team", "uid": "u-1"}
    assert bookkeeping.newly_handled(
        {"handledFailures": ["a", "b"]}, {"handledFailures": ["b", "d", "c"]}
    ) == ["c", "d"]
    assert bookkeeping.newly_handled({}, {"disruptions": 1}) == []
    reasons = ["Disruption", "Disruption", "Resized"]
    names = bookkeeping.counted_event_names(job, ["c", "d"], reasons)
    assert names == bookkeeping.counted_event_names(dict(job), ["c", "d"], reasons)
    assert len(set(names)) == 3 and all(n.startswith("digits.") and len(n) == 23 for n in names)
    assert names[0] not in bookkeeping.counted_event_names(job, ["c"], reasons)
    assert names[0] not in bookkeeping.counted_event_names(
        {**job, "uid": "u-2"}, ["c", "d"], reasons
    )
    assert bookkeeping.counted_event_names(job, ["c", "d"], reasons[1:])[0] == names[0]


def test_settings_are_read_once_from_the_environment_and_bad_values_say_which() -> None:
    s = Settings.from_env(
        {"DDP_DEFAULT_IMAGE": "t:1", "DDP_BACKOFF_BASE_S": "1", "DDP_WORKERS": "8"}
    )
    assert s.render.default_image == "t:1" and s.backoff_base_s == 1.0 and s.workers == 8
    assert s.resync_s == 30.0 and s.render.monitor_interval_s == 1.0  # the defaults
    assert Settings.from_env({}) == Settings()
    with pytest.raises(ValueError, match=r"DDP_RESYNC_S='often' is not a number"):
        Settings.from_env({"DDP_RESYNC_S": "often"})
    with pytest.raises(ValueError, match=r"DDP_WORKERS='0' must be at least 1"):
        Settings.from_env({"DDP_WORKERS": "0"})
