"""The test Prometheus server's pure parts: its scrape config and reading query answers."""

from __future__ import annotations

import pytest

from ddp_devcluster.prometheus import samples, scrape_config


def test_each_job_scrapes_its_static_targets_every_second() -> None:
    config = scrape_config({"ddp-operator": ["127.0.0.1:8081"], "trainers": ["10.1.1.2:9400"]})
    assert config["global"] == {"scrape_interval": "1s", "scrape_timeout": "1s"}
    assert config["scrape_configs"] == [
        {"job_name": "ddp-operator", "static_configs": [{"targets": ["127.0.0.1:8081"]}]},
        {"job_name": "trainers", "static_configs": [{"targets": ["10.1.1.2:9400"]}]},
    ]


def test_an_instant_query_answer_becomes_labels_and_values() -> None:
    answer = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": {"__name__": "up", "job": "x"}, "value": [1.5, "1"]}],
        },
    }
    assert samples(answer) == [({"__name__": "up", "job": "x"}, 1.0)]
    with pytest.raises(RuntimeError, match="refused"):
        samples({"status": "error", "error": "parse error"})
