"""Both metrics endpoints in a real run, read as Prometheus reads them: the operator's and every
trainer pod's, scraped while the job is held at a known step, parsed with Prometheus' own text
parser (prometheus_client.parser), and scraped by a real Prometheus server and queried back."""

from __future__ import annotations

import json

import pytest
from e2e_scenario import CLAIMS, Scenario

from ddp_devcluster.harness import holding_at
from ddp_devcluster.prometheus import PrometheusServer, scrape

pytestmark = pytest.mark.e2e


def test_the_operator_and_every_trainer_pod_serve_metrics_while_training(sc: Scenario) -> None:
    sc.apply_example(CLAIMS, "digits.yaml", edit=holding_at(20, last=22))
    sc.held("digits", 20)

    assert sc.s.operator is not None
    op = scrape(sc.s.operator.metrics_url)
    assert op[("ddp_operator_jobs", (("namespace", sc.ns), ("phase", "Running")))] == 1
    assert op[("ddp_operator_job_pods_created_seconds_count", ())] >= 1
    assert op[("ddp_operator_job_first_step_seconds_count", ())] >= 1

    pods = json.loads(sc.k("get", "pods", "-l", "ddp.dev/role=worker", "-o", "json"))["items"]
    assert len(pods) == 2
    urls = []
    for pod in pods:
        (port,) = [
            p["containerPort"]
            for c in pod["spec"]["containers"]
            for p in c.get("ports", [])
            if p["name"] == "metrics"
        ]
        urls.append(f"http://{pod['status']['podIP']}:{port}/metrics")
        m = scrape(urls[-1])
        assert m[("ddp_trainer_step", ())] == 20
        assert m[("ddp_trainer_world_size", ())] == 2
        assert m[("ddp_trainer_step_seconds_count", ())] >= 1
        assert m[("ddp_trainer_learning_rate", ())] > 0
        assert 0 < m[("ddp_trainer_loss", ())] < 10
        assert all(set(dict(labels)) <= {"le"} for _, labels in m)

    def checkpointed() -> list[float] | None:
        """The last checkpoint step of each endpoint that has one: rank 0's alone."""
        steps = [scrape(u).get(("ddp_trainer_last_checkpoint_step", ())) for u in urls]
        found = [s for s in steps if s is not None]
        return found if found == [20] else None

    # Only global rank 0 writes checkpoints; step 20's (everySteps: 20) is written in the
    # background, so its metric may follow the hold by a moment.
    sc.until("rank 0's metrics show the checkpoint of step 20", checkpointed)

    # The same through a real Prometheus server: both pods and the operator as scrape targets.
    assert sc.s.workdir is not None
    targets = {
        "ddp-operator": [f"127.0.0.1:{sc.s.operator.metrics_port}"],
        "ddp-trainers": [u.removeprefix("http://").removesuffix("/metrics") for u in urls],
    }
    with PrometheusServer(sc.s.workdir / f"prometheus-{sc.ns}", targets) as prom:
        steps = sc.until(
            "Prometheus has scraped both trainer pods",
            lambda: (found := prom.query("ddp_trainer_step")) and len(found) == 2 and found,
        )
        assert sorted(value for _, value in steps) == [20, 20]
        assert {labels["job"] for labels, _ in steps} == {"ddp-trainers"}
        running = f'ddp_operator_jobs{{namespace="{sc.ns}",phase="Running"}}'
        jobs = sc.until("Prometheus has scraped the operator", lambda: prom.query(running))
        assert [value for _, value in jobs] == [1]
        up = prom.query("up")
        assert len(up) == 3 and all(value == 1 for _, value in up)

    sc.release("digits-checkpoints", 20)
    sc.phase("digits", "Succeeded", 300)
