"""Progress records from training pods are untrusted input: what passes, what is refused and why,
and who a pod is to the API server."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from ddp_api.ddpjob import DDPJob
from ddp_operator import plan, render, reports

GOOD = {
    "epoch": 1,
    "step": 30,
    "totalSteps": 88,
    "loss": 0.25,
    "samplesPerSecond": 900.0,
    "lastCheckpoint": "step-00000028.pt",
    "updatedAt": "2026-11-24T10:00:00Z",
    "worldSize": 2,
    "heldAtStep": None,
}


def record(text: str | None, owner: str = "u-1") -> reports.Record:
    data = {} if text is None else {"progress": text}
    cm = {
        "metadata": {
            "name": "j-progress",
            "ownerReferences": [{"uid": owner, "controller": True}],
        },
        "data": data,
    }
    return reports.record_of(cm)


def test_a_good_record_is_kept_whole_and_missing_fields_are_unset() -> None:
    assert reports.parse(record(json.dumps(GOOD))) == GOOD
    assert reports.parse(record('{"step": 3}')) == {**dict.fromkeys(reports.FIELDS), "step": 3}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"phase": "Succeeded"}', "phase is not a field of status.progress"),
        ('{"estimatedRemainingSeconds": 1}', "estimatedRemainingSeconds is not a field"),
        ('{"step": 3, "conditions": [], "restarts": 0}', "conditions, restarts are not fields"),
        ('{"loss": NaN}', "NaN is not a number JSON allows"),
        ('{"loss": Infinity}', "Infinity is not a number JSON allows"),
        ('{"loss": 1e400}', "loss must be a finite number"),
        ('{"step": -1}', "step must be between 0"),
        ('{"step": 1.5}', "step must be an integer, not float"),
        ('{"step": true}', "step must be an integer, not bool"),
        ('{"step": "30"}', "step must be an integer, not str"),
        ('{"worldSize": 0}', "worldSize must be between 1"),
        ('{"samplesPerSecond": -3}', "samplesPerSecond must not be negative"),
        ('{"step": 90, "totalSteps": 88}', "step 90 is beyond totalSteps 88"),
        ('{"heldAtStep": 90, "totalSteps": 88}', "heldAtStep 90 is beyond totalSteps 88"),
        ('{"lastCheckpoint": "' + "x" * 300 + '"}', "at most 253 characters"),
        ('{"lastCheckpoint": "a\\u001b[2Jb"}', "printable text"),
        ('{"updatedAt": "yesterday"}', "updatedAt must be a time"),
        ('[{"step": 1}]', "must be a JSON object, not list"),
        ('{"step": 1', "is not JSON"),
        ("x" * 5000, "5000 characters, over 4096"),
    ],
)
def test_a_forged_or_malformed_record_is_refused_naming_why(text: str, why: str) -> None:
    with pytest.raises(reports.Rejected, match=why.replace("[", r"\[").replace("(", r"\(")):
        reports.parse(record(text))


def test_the_cache_keeps_a_bounded_record_and_finds_the_job_by_name_not_label() -> None:
    huge = record("x" * 100_000)
    assert huge.text is None and huge.chars == 100_000  # not kept in the operator's memory
    relabelled = {"metadata": {"name": "a-progress", "labels": {render.LABEL_JOB: "b"}}}
    assert reports.job_of(relabelled) == "a"
    assert reports.job_of({"metadata": {"name": "a-config"}}) is None
    assert record(None).text is None and record(None).chars == 0


JOB = {"metadata": {"name": "j", "namespace": "ns", "uid": "u-1"}, "spec": {"nodes": 2}}
NOW = dt.datetime(2026, 11, 24, 10, 0, tzinfo=dt.UTC)
CFG = render.OperatorConfig()


def planned(status: dict[str, Any], progress: dict[str, Any] | None) -> dict[str, Any]:
    job = DDPJob.model_validate(JOB)
    return plan.plan(job, status, [], NOW, CFG, progress=progress).status


def test_the_planner_copies_a_changed_record_and_removes_what_it_unsets() -> None:
    held = {**GOOD, "heldAtStep": 30}
    status = {"phase": "Running", "progress": reports.without_unset(held)}
    new = planned(status, GOOD)
    assert new["progress"]["heldAtStep"] is None  # the merge patch removes it
    assert new["worldSize"] == 2
    # The same progress again writes nothing; none reported keeps what the status has.
    assert "progress" not in planned(
        {"phase": "Running", "progress": reports.without_unset(GOOD)}, GOOD
    )
    assert "progress" not in planned(status, None)


def test_the_time_left_is_the_pace_between_the_last_two_reports() -> None:
    later = {**GOOD, "step": 40, "updatedAt": "2026-11-24T10:00:20Z"}  # 10 steps in 20 s
    assert reports.remaining_seconds(GOOD, later) == 96  # 48 steps left at 0.5 steps/s
    assert reports.remaining_seconds(None, later) is None  # the first report: no pace yet
    shown = {**reports.without_unset(later), reports.ETA: 96}
    assert reports.remaining_seconds(shown, later) == 96  # the same report again
    resumed = {**GOOD, "step": 28, "updatedAt": "2026-11-24T10:01:00Z"}  # from a checkpoint
    assert reports.remaining_seconds(shown, resumed) is None
    held = {**later, "step": 44, "heldAtStep": 44, "updatedAt": "2026-11-24T10:00:30Z"}
    assert reports.remaining_seconds(shown, held) is None
    assert reports.remaining_seconds(GOOD, {**later, "totalSteps": None}) is None


def test_the_planner_writes_the_time_left_with_the_record() -> None:
    later = {**GOOD, "step": 40, "updatedAt": "2026-11-24T10:00:20Z"}
    status = {"phase": "Running", "progress": reports.without_unset(GOOD)}
    assert planned(status, later)["progress"][reports.ETA] == 96
    shown = {"phase": "Running", "progress": {**reports.without_unset(later), reports.ETA: 96}}
    assert "progress" not in planned(shown, later)  # nothing new: no write


def pod_spec(spec: dict[str, Any]) -> dict[str, Any]:
    job = DDPJob.model_validate({**JOB, "spec": {**JOB["spec"], **spec}})
    return render.render_worker(job, 0, 0, CFG)["spec"]


def test_a_pod_gets_its_jobs_own_account_no_credential_or_the_users_account() -> None:
    bundled = pod_spec({})
    assert bundled["serviceAccountName"] == "j-trainer"
    assert "automountServiceAccountToken" not in bundled
    own = pod_spec({"command": ["torchrun", "/scripts/train.py"]})
    assert own["automountServiceAccountToken"] is False and "serviceAccountName" not in own
    users = pod_spec({"template": {"serviceAccountName": "mine"}})
    assert users["serviceAccountName"] == "mine"
    store = render.render_store(DDPJob.model_validate(JOB), CFG)["spec"]
    assert store["automountServiceAccountToken"] is False
    for obj in render.render_trainer_identity(DDPJob.model_validate(JOB)):
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "u-1"  # goes with the job
