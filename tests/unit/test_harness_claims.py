"""``Harness.apply_example`` applies only the claims its DDPJobs name."""

from __future__ import annotations

import yaml

from ddp_devcluster.harness import EXAMPLES, claim_names, claims_unused


def _docs(*files: str) -> list[dict]:
    return [d for f in files for d in yaml.safe_load_all((EXAMPLES / f).read_text()) if d]


def test_a_job_keeps_only_the_claim_it_names() -> None:
    docs = _docs("checkpoint-pvc-shared.yaml", "digits.yaml")
    unused = claims_unused(docs)
    kept = [d["metadata"]["name"] for d in docs if id(d) not in unused]
    assert kept == ["digits-checkpoints", "digits"]


def test_claims_named_in_a_pod_template_are_kept_too() -> None:
    docs = _docs("checkpoint-pvc-shared.yaml", "digits.yaml")
    job = docs[-1]
    job["spec"]["template"] = {
        "spec": {
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "charlm-checkpoints"}}
            ]
        }
    }
    assert claim_names(job) == {"digits-checkpoints", "charlm-checkpoints"}
    kept = {d["metadata"]["name"] for d in docs if id(d) not in claims_unused(docs)}
    assert kept == {"digits-checkpoints", "charlm-checkpoints", "digits"}


def test_claims_alone_are_all_applied() -> None:
    docs = _docs("checkpoint-pvc-shared.yaml")
    assert len(docs) == 4
    assert claims_unused(docs) == set()


def test_a_job_naming_a_missing_claim_drops_every_claim() -> None:
    docs = _docs("checkpoint-pvc-shared.yaml", "digits.yaml")
    docs[-1]["spec"]["checkpoint"]["volume"]["persistentVolumeClaim"]["claimName"] = "nope"
    assert len(claims_unused(docs)) == 4
