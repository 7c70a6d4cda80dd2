"""A real Prometheus server on loopback, scraping given targets (development and tests).

Built from the Go module proxy like the control plane (``python -m ddp_devcluster build``),
without the optional service discoveries. It scrapes static targets every second and answers
PromQL on ``/api/v1/query``, so a test reads metrics as a user's Prometheus stores them.

    with PrometheusServer(workdir, {"operator": ["127.0.0.1:8081"]}) as prom:
        prom.query('ddp_operator_jobs{phase="Running"}')
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from .managed import ManagedProcess, http_ok
from .plane import Process, binary
from .procs import free_port

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    """A ``/metrics`` page parsed by Prometheus' own text parser (prometheus_client's):
    (sample name, its sorted labels) -> value. Every family must have its help text."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        assert family.documentation, f"{family.name} at {url} has no help text"
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def scrape_config(targets: Mapping[str, Sequence[str]], interval_s: int = 1) -> dict[str, Any]:
    """prometheus.yml scraping each job's ``host:port`` targets at ``/metrics``."""
    return {
        "global": {"scrape_interval": f"{interval_s}s", "scrape_timeout": f"{interval_s}s"},
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": list(hosts)}]}
            for job, hosts in targets.items()
        ],
    }


def samples(answer: Mapping[str, Any]) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of each series of an instant query's JSON answer."""
    if answer.get("status") != "success":
        raise RuntimeError(f"Prometheus refused the query: {answer}")
    return [(dict(r["metric"]), float(r["value"][1])) for r in answer["data"]["result"]]


class PrometheusServer(ManagedProcess):
    """``prometheus`` scraping ``targets`` (job name -> ``host:port`` list), on a free port."""

    name = "prometheus"
    tail_lines = 30

    def __init__(self, workdir: Path, targets: Mapping[str, Sequence[str]]):
        self.workdir = workdir
        self.targets = targets
        self.port = 0
        self.process: Process | None = None

    @property
    def log(self) -> Path:
        return self.workdir / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> PrometheusServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(scrape_config(self.targets)))
        self.port = free_port()
        argv = [
            str(binary("prometheus")),
            f"--config.file={config}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        self.launch(argv, {})
        self.wait_for(lambda: http_ok(self.url + "/-/ready"), "prometheus /-/ready", timeout_s)
        return self

    def query(self, promql: str) -> list[tuple[dict[str, str], float]]:
        """An instant query: (labels, value) per series."""
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as r:
            return samples(json.loads(r.read()))
