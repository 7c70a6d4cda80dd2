"""Prometheus metrics of one trainer process: names, help, labels, values, and the endpoint."""

from __future__ import annotations

import logging
import math
import socket
import urllib.request

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ddp_api.contract import DEFAULT_METRICS_PORT
from ddp_api.trainer_config import ConfigError, TrainerConfig, build_config
from ddp_devcluster.procs import free_port
from ddp_devcluster.pytest_plugin import unavailable
from ddp_trainer.reporting.prometheus import PREFIX, TrainerMetrics, listen_address, serve

EVERY_PROCESS = {
    "ddp_trainer_step_seconds",
    "ddp_trainer_step",
    "ddp_trainer_total_steps",
    "ddp_trainer_epoch",
    "ddp_trainer_samples_per_second",
    "ddp_trainer_loss",
    "ddp_trainer_learning_rate",
    "ddp_trainer_grad_norm",
    "ddp_trainer_non_finite_steps",
    "ddp_trainer_world_size",
    "ddp_trainer_worker_restarts",
}
RANK_ZERO = {
    "ddp_trainer_checkpoint_seconds",
    "ddp_trainer_checkpoint_blocked_seconds",
    "ddp_trainer_checkpoint_bytes",
    "ddp_trainer_last_checkpoint_step",
    "ddp_trainer_checkpoint_failures",
}


def scrape(metrics: TrainerMetrics) -> dict[str, dict[str, float]]:
    """{family: {sample name: value}} of the text exposition; every label checked on the way."""
    text = generate_latest(metrics.registry).decode()
    families = {}
    for family in text_string_to_metric_families(text):
        assert family.documentation, f"{family.name} has no HELP text"
        assert family.name.startswith(PREFIX), family.name
        for sample in family.samples:
            assert set(sample.labels) <= {"le"}, sample  # no label but a histogram's buckets
        if family.name.endswith("_created"):  # prometheus_client: when a histogram began
            continue
        families[family.name] = {
            s.name: s.value for s in family.samples if not s.labels or s.labels["le"] == "+Inf"
        }
    return families


def test_every_process_has_its_metrics_and_only_rank_zero_has_the_checkpoint_ones() -> None:
    main = scrape(TrainerMetrics(is_main=True, world_size=4, restarts=2))
    other = scrape(TrainerMetrics(is_main=False, world_size=4, restarts=2))
    assert set(main) == EVERY_PROCESS | RANK_ZERO
    assert set(other) == EVERY_PROCESS
    assert main["ddp_trainer_world_size"]["ddp_trainer_world_size"] == 4
    assert other["ddp_trainer_worker_restarts"]["ddp_trainer_worker_restarts"] == 2


def test_a_run_fills_them_in() -> None:
    metrics = TrainerMetrics(is_main=True, world_size=2, restarts=0)
    metrics.started(step=20, epoch=1, total_steps=90, resumed_step=20)
    for step in (21, 22, 23):
        metrics.step_done(seconds=0.5, step=step, epoch=1, lr=0.002, grad_norm=step / 10)
    metrics.non_finite_step()
    metrics.progress(loss=0.75, samples_per_second=256.0)
    metrics.checkpoint_blocked(0.01)
    metrics.checkpoint_written(step=23, seconds=0.2, size=12345)
    metrics.checkpoint_failed()
    values = scrape(metrics)
    expected = {
        ("ddp_trainer_step", "ddp_trainer_step"): 23,
        ("ddp_trainer_total_steps", "ddp_trainer_total_steps"): 90,
        ("ddp_trainer_step_seconds", "ddp_trainer_step_seconds_count"): 3,
        ("ddp_trainer_step_seconds", "ddp_trainer_step_seconds_sum"): 1.5,
        ("ddp_trainer_learning_rate", "ddp_trainer_learning_rate"): 0.002,
        ("ddp_trainer_grad_norm", "ddp_trainer_grad_norm"): 2.3,
        ("ddp_trainer_non_finite_steps", "ddp_trainer_non_finite_steps_total"): 1,
        ("ddp_trainer_loss", "ddp_trainer_loss"): 0.75,
        ("ddp_trainer_samples_per_second", "ddp_trainer_samples_per_second"): 256,
        ("ddp_trainer_checkpoint_bytes", "ddp_trainer_checkpoint_bytes"): 12345,
        ("ddp_trainer_last_checkpoint_step", "ddp_trainer_last_checkpoint_step"): 23,
        ("ddp_trainer_checkpoint_seconds", "ddp_trainer_checkpoint_seconds_count"): 1,
    }
    assert {(m, s): values[m][s] for m, s in expected} == expected
    blocked = values["ddp_trainer_checkpoint_blocked_seconds"]
    assert blocked["ddp_trainer_checkpoint_blocked_seconds_count"] == 1
    failures = values["ddp_trainer_checkpoint_failures"]
    assert failures["ddp_trainer_checkpoint_failures_total"] == 1


def test_per_step_mode_tells_the_groups_and_world_of_the_latest_committed_step() -> None:
    metrics = TrainerMetrics(is_main=True, world_size=2, restarts=0, per_step=True)
    assert set(scrape(metrics)) == EVERY_PROCESS | RANK_ZERO | {"ddp_trainer_replica_groups"}
    for groups in (3, 2):  # a group lost: the quorum shrinks while this process runs
        metrics.membership(world_size=groups * 2, groups=groups)
    values = scrape(metrics)
    assert values["ddp_trainer_replica_groups"]["ddp_trainer_replica_groups"] == 2
    assert values["ddp_trainer_world_size"]["ddp_trainer_world_size"] == 4
    # Restart mode has no such series (no zeros that look like data).
    restart = TrainerMetrics(is_main=True, world_size=2, restarts=0)
    restart.membership(world_size=2, groups=None)
    assert "ddp_trainer_replica_groups" not in scrape(restart)


def test_a_resumed_run_reports_the_checkpoint_it_resumed_from() -> None:
    metrics = TrainerMetrics(is_main=True, world_size=1, restarts=1)
    metrics.started(step=40, epoch=2, total_steps=90, resumed_step=40)
    last = scrape(metrics)["ddp_trainer_last_checkpoint_step"]
    assert last["ddp_trainer_last_checkpoint_step"] == 40


def test_other_ranks_ignore_checkpoints() -> None:
    metrics = TrainerMetrics(is_main=False, world_size=2, restarts=0)
    metrics.started(step=0, epoch=0, total_steps=10, resumed_step=5)
    metrics.checkpoint_blocked(0.1)
    metrics.checkpoint_written(step=5, seconds=0.1, size=10)
    metrics.checkpoint_failed()
    assert not RANK_ZERO & set(scrape(metrics))


def test_a_failing_update_never_reaches_the_training_loop(caplog) -> None:
    metrics = TrainerMetrics(is_main=True, world_size=1, restarts=0)
    with caplog.at_level(logging.WARNING, logger="ddp_trainer.metrics"):
        metrics.progress(loss="not a number", samples_per_second=1.0)  # type: ignore[arg-type]
        metrics.step_done(seconds=None, step=1, epoch=0, lr=0.1)  # type: ignore[arg-type]
        metrics.checkpoint_written(step="x", seconds=0.1, size=None)  # type: ignore[arg-type]
    assert len(caplog.records) == 1 and "training goes on" in caplog.records[0].getMessage()
    metrics.progress(loss=float("nan"), samples_per_second=0.0)  # a NaN loss is a value
    assert math.isnan(scrape(metrics)["ddp_trainer_loss"]["ddp_trainer_loss"])


def test_the_endpoint_serves_the_registry_over_http() -> None:
    metrics = TrainerMetrics(is_main=True, world_size=3, restarts=0)
    port = free_port()
    server = serve(metrics.registry, port, address="127.0.0.1")
    assert server is not None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["ddp_trainer_world_size"].samples[0].value == 3


def test_the_endpoint_listens_on_ipv6_too_where_the_pod_ip_is_ipv6() -> None:
    assert listen_address({}) == "0.0.0.0"  # outside a pod
    assert listen_address({"POD_IP": "10.244.1.7"}) == "0.0.0.0"
    assert listen_address({"POD_IP": "fd00:10:244::7"}) == "::"


def test_listening_on_ipv6_serves_ipv4_clients_too() -> None:
    if not socket.has_ipv6:
        unavailable("no IPv6 on this machine")
    metrics = TrainerMetrics(is_main=True, world_size=1, restarts=0)
    port = free_port()
    server = serve(metrics.registry, port, address="::")
    if server is None:
        unavailable("IPv6 cannot be bound here")
    try:
        for host in ("127.0.0.1", "[::1]"):
            with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
                assert b"ddp_trainer_world_size 1.0" in response.read()
    finally:
        server.shutdown()
        server.server_close()


def test_port_zero_serves_nothing() -> None:
    assert serve(TrainerMetrics(is_main=True, world_size=1, restarts=0).registry, 0) is None


def test_a_taken_port_is_one_warning_not_an_error(caplog) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        registry = TrainerMetrics(is_main=True, world_size=1, restarts=0).registry
        with caplog.at_level(logging.WARNING, logger="ddp_trainer.metrics"):
            assert serve(registry, port, address="127.0.0.1") is None
    assert len(caplog.records) == 1
    assert f"cannot serve Prometheus metrics on port {port}" in caplog.records[0].getMessage()


def test_the_metrics_port_setting() -> None:
    assert TrainerConfig().metrics_port == DEFAULT_METRICS_PORT == 9400
    assert build_config({"metricsPort": 0}).metrics_port == 0  # off
    assert build_config({"metricsPort": 65535}).metrics_port == 65535
    with pytest.raises(ConfigError, match=r"^metricsPort: .*greater than or equal to 0"):
        build_config({"metricsPort": -1})
    with pytest.raises(ConfigError, match=r"^metricsPort: .*less than or equal to 65535"):
        build_config({"metricsPort": 65536})
