"""The operator's metrics: the pure counting and milestone decisions, and the registry as
Prometheus reads it (parsed with prometheus_client's own text parser)."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ddp_operator import bookkeeping
from ddp_operator.metrics import PHASES, OperatorMetrics, phase_counts
from ddp_operator.settings import Settings


def _job(ns: str, phase: str | None) -> dict[str, object]:
    return {"metadata": {"namespace": ns, "name": "j"}, "status": {"phase": phase} if phase else {}}


def test_jobs_are_counted_by_namespace_and_phase_with_zeros_for_the_other_phases() -> None:
    counts = phase_counts([_job("a", "Running"), _job("a", "Running"), _job("b", None)])
    assert counts[("a", "Running")] == 2
    assert counts[("b", "Pending")] == 1  # no phase written yet
    assert counts[("a", "Failed")] == 0
    assert len(counts) == 2 * len(PHASES)
    assert phase_counts([]) == {}


def test_start_up_milestones_are_timed_only_when_this_process_saw_them_ahead() -> None:
    assert bookkeeping.milestones_to_time({}, workers=0) == {
        bookkeeping.PODS_CREATED,
        bookkeeping.FIRST_STEP,
    }
    # An operator restarted mid-run: the job's age is no start-up latency.
    running = {"phase": "Running", "progress": {"step": 40}}
    assert bookkeeping.milestones_to_time(running, workers=2) == set()
    assert bookkeeping.milestones_to_time({"phase": "Running"}, workers=2) == {
        bookkeeping.FIRST_STEP
    }
    assert bookkeeping.milestones_to_time({"restarts": 1}, workers=0) == set()
    assert bookkeeping.milestones_to_time({"phase": "Suspended"}, workers=0) == set()

    ahead = {bookkeeping.PODS_CREATED, bookkeeping.FIRST_STEP}
    assert bookkeeping.milestones_reached(ahead, {}, workers=1, nodes=2) == set()
    assert bookkeeping.milestones_reached(ahead, {}, workers=2, nodes=2) == {
        bookkeeping.PODS_CREATED
    }
    stepped = {"progress": {"step": 1}}
    assert bookkeeping.milestones_reached({bookkeeping.FIRST_STEP}, stepped, 2, 2) == {
        bookkeeping.FIRST_STEP
    }


def test_every_metric_has_help_text_and_only_bounded_labels() -> None:
    m = OperatorMetrics()
    m.watch_jobs(lambda: [_job("team", "Running")])
    m.track_queue(lambda: 3)
    m.restarts.labels("PodFailed").inc()
    m.api_errors.labels("409").inc(2)
    m.job_pods_created.observe(0.7)
    families = {
        f.name: f for f in text_string_to_metric_families(generate_latest(m.registry).decode())
    }
    assert set(families) >= {
        "ddp_operator_jobs",
        "ddp_operator_job_pods_created_seconds",
        "ddp_operator_job_first_step_seconds",
        "ddp_operator_reconcile_duration_seconds",
        "ddp_operator_workqueue_depth",
        "ddp_operator_pod_creates",
        "ddp_operator_pod_deletes",
        "ddp_operator_restarts",
        "ddp_operator_api_errors",
    }
    allowed = {"namespace", "phase", "reason", "code", "le"}
    for f in families.values():
        assert f.documentation, f"{f.name} has no help text"
        for sample in f.samples:
            assert set(sample.labels) <= allowed, sample
    value = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples
    }
    assert value[("ddp_operator_jobs", (("namespace", "team"), ("phase", "Running")))] == 1
    assert value[("ddp_operator_workqueue_depth", ())] == 3
    assert value[("ddp_operator_restarts_total", (("reason", "PodFailed"),))] == 1
    assert value[("ddp_operator_api_errors_total", (("code", "409"),))] == 2
    assert value[("ddp_operator_job_pods_created_seconds_count", ())] == 1


def test_the_metrics_port_is_a_setting_and_0_turns_it_off() -> None:
    assert Settings().metrics_port == 8081
    assert Settings.from_env({"DDP_METRICS_PORT": "0"}).metrics_port == 0
    m = OperatorMetrics()
    m.serve(0)  # serves nothing, raises nothing
    assert m._server is None
