"""Two live jobs on one checkpoint claim are found from the job index's snapshots."""

from __future__ import annotations

from typing import Any

from ddp_operator.claims import claim_of, shared_message, sharing


def snapshot(name: str, claim: str | None, ns: str = "team", **rest: Any) -> dict[str, Any]:
    volume = {"persistentVolumeClaim": {"claimName": claim}} if claim else {"emptyDir": {}}
    spec = {"checkpoint": {"volume": volume}, **rest.pop("spec", {})}
    return {"metadata": {"name": name, "namespace": ns}, "spec": spec, **rest}


def test_only_live_jobs_of_the_namespace_on_the_same_claim_are_named() -> None:
    jobs = [
        snapshot("me", "ckpt"),
        snapshot("running", "ckpt", status={"phase": "Running"}),
        snapshot("new", "ckpt"),  # no status yet: it is starting
        snapshot("done", "ckpt", status={"phase": "Succeeded"}),
        snapshot("failed", "ckpt", status={"phase": "Failed"}),
        snapshot("paused", "ckpt", spec={"suspend": True}, status={"phase": "Suspended"}),
        snapshot("elsewhere", "ckpt", ns="other"),
        snapshot("apart", "own"),
        snapshot("scratch", None),
    ]
    assert sharing("team", "me", "ckpt", jobs) == ["new", "running"]
    assert sharing("team", "me", None, jobs) == []  # no claim: nothing to share
    assert sharing("team", "apart", "own", jobs) == []


def test_the_claim_is_read_from_a_spec_and_the_warning_names_the_others_and_the_fix() -> None:
    assert claim_of(snapshot("a", "ckpt")["spec"]) == "ckpt"
    assert claim_of(snapshot("a", None)["spec"]) is None and claim_of({}) is None
    said = shared_message("ckpt", ["a", "b"])
    assert said.startswith("spec.checkpoint.volume is claim ckpt, which ddpjob/a, ddpjob/b also")
    assert said.endswith("give each job a claim of its own")
