"""Progress records from training pods are untrusted input: what passes, what is refused and why,
and who a pod is to the API server."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from ddp_api import contract
from ddp_api.ddpjob import DDPJob
from ddp_operator import informer, render, reports
from ddp_operator.planner import views
from ddp_operator.planner.plan import PlanSettings, plan
from ddp_operator.progress_records import ProgressRecords

GOOD = {
    "epoch": 1,
    "step": 30,
    "totalSteps": 88,
    "loss": 0.25,
    "samplesPerSecond": 900.0,
    "lastCheckpoint": "step-00000028.pt",
    "updatedAt": "2026-11-24T10:00:00Z",
    "worldSize": 2,
    "groups": 2,
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
        ('{"eta": "1s"}', "eta is not a field"),  # the operator's to compute, as the seconds
        ('{"step": 3, "conditions": [], "restarts": 0}', "conditions, restarts are not fields"),
        ('{"loss": NaN}', "NaN is not a number JSON allows"),
        ('{"loss": Infinity}', "Infinity is not a number JSON allows"),
        ('{"loss": 1e400}', "loss must be a finite number"),
        ('{"step": -1}', "step must be between 0"),
        ('{"step": 1.5}', "step must be an integer, not float"),
        ('{"step": true}', "step must be an integer, not bool"),
        ('{"step": "30"}', "step must be an integer, not str"),
        ('{"worldSize": 0}', "worldSize must be between 1"),
        ('{"groups": 0}', "groups must be between 1"),  # a step is trained by some group
        ('{"groups": 2.0}', "groups must be an integer, not float"),
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
RULES = PlanSettings(CFG)


def planned(status: dict[str, Any], progress: dict[str, Any] | None) -> dict[str, Any]:
    job = DDPJob.model_validate(JOB)
    return plan(job, status, [], NOW, RULES, progress=progress).status


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
    progress = planned(status, later)["progress"]
    assert progress[reports.ETA] == 96 and progress[reports.ETA_TEXT] == "1m36s"
    eta = {reports.ETA: 96, reports.ETA_TEXT: "1m36s"}
    shown = {"phase": "Running", "progress": {**reports.without_unset(later), **eta}}
    assert "progress" not in planned(shown, later)  # nothing new: no write
    first = planned({"phase": "Running"}, GOOD)["progress"]  # no pace yet: neither is set
    assert first[reports.ETA] is None and first[reports.ETA_TEXT] is None


def pod_spec(spec: dict[str, Any]) -> dict[str, Any]:
    job = DDPJob.model_validate({**JOB, "spec": {**JOB["spec"], **spec}})
    return render.render_worker(job, 0, 0, CFG)["spec"]


def test_a_pod_gets_a_trainer_account_no_credential_or_the_users_account() -> None:
    bundled = pod_spec({})
    assert bundled["serviceAccountName"] == "ddp-trainer-progress"  # the namespace's
    assert "automountServiceAccountToken" not in bundled
    job = DDPJob.model_validate(JOB)
    per_job = render.OperatorConfig(progress_in_pod=False)  # the policy is not in force
    assert render.render_worker(job, 0, 0, per_job)["spec"]["serviceAccountName"] == "j-trainer"
    own = pod_spec({"command": ["torchrun", "/scripts/train.py"]})
    assert own["automountServiceAccountToken"] is False and "serviceAccountName" not in own
    users = pod_spec({"template": {"serviceAccountName": "mine"}})
    assert users["serviceAccountName"] == "mine"
    store = render.render_store(DDPJob.model_validate(JOB), CFG)["spec"]
    assert store["automountServiceAccountToken"] is False
    for obj in render.render_trainer_identity(DDPJob.model_validate(JOB)):
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "u-1"  # goes with the job


def pod_with(text: str | None, owner: str = "u-1", name: str = "j-node-0") -> dict[str, Any]:
    annotations = {} if text is None else {contract.PROGRESS_ANNOTATION: text}
    meta = {
        "namespace": "ns",
        "name": name,
        "uid": f"uid-{name}",
        "labels": {render.LABEL_JOB: "j", render.LABEL_ROLE: "worker", render.LABEL_INDEX: "0"},
        "annotations": {"other": "x", **annotations},
        "ownerReferences": [{"uid": owner, "controller": True}],
    }
    return {"metadata": meta, "status": {"phase": "Running"}}


def view(
    record: dict[str, Any] | str | None, owner: str = "u-1", name: str = "j-node-0"
) -> views.PodView:
    text = record if record is None or isinstance(record, str) else json.dumps(record)
    return views.view(pod_with(text, owner, name))


def test_a_pods_annotation_is_a_record_of_the_job_that_owns_the_pod() -> None:
    assert view(None).progress is None  # no annotation: nothing reported by this pod
    kept = view(GOOD).progress
    assert kept is not None and kept.owner == "u-1" and reports.parse(kept) == GOOD
    huge = view("x" * 100_000).progress
    assert huge is not None and huge.text is None and huge.chars == 100_000


def at(second: int, **fields: Any) -> dict[str, Any]:
    return {**GOOD, "updatedAt": f"2026-11-24T10:00:{second:02d}Z", **fields}


def test_the_newest_record_of_the_jobs_pods_wins_and_never_an_older_than_the_status() -> None:
    """Rank 0 moved from node-1 (its last record stays there) to node-0."""
    records = ProgressRecords()
    key = ("ns", "j")
    pods = [view(at(40, step=41), name="j-node-0"), view(at(10, step=50), name="j-node-1")]
    progress, refused = records.latest(key, "u-1", pods, None)
    assert progress == at(40, step=41) and refused == []
    # node-0 was deleted after the status had its record: node-1's older one is not taken.
    progress, _ = records.latest(key, "u-1", pods[1:], at(40, step=41))
    assert progress is None
    # Another job's pods (a namesake's, not yet collected) are not this job's.
    assert records.latest(key, "u-1", [view(at(50), owner="u-0")], None) == (None, [])


def test_a_deleted_pods_last_record_is_kept_for_its_job() -> None:
    records = ProgressRecords()
    c = informer.Cache(render.LABEL_JOB, views.view, removed=records.pod_removed)
    c.apply("ADDED", pod_with(json.dumps(at(5, step=60))))
    c.apply("DELETED", pod_with(json.dumps(at(9, step=66))))  # the final report, as deleted
    assert c.get(("ns", "j")) == []
    assert records.latest(("ns", "j"), "u-1", [], at(5, step=60))[0] == at(9, step=66)
    records.forget("u-1")
    assert records.latest(("ns", "j"), "u-1", [], None) == (None, [])


def test_a_refused_record_in_a_pod_is_said_once_naming_the_pod_and_the_rule() -> None:
    records = ProgressRecords()
    bad = [view('{"phase": "Succeeded"}', name="j-node-1")]
    _, refused = records.latest(("ns", "j"), "u-1", bad, None)
    assert refused == [
        "ignored the progress in annotation ddp.dev/progress of pod j-node-1: phase is not a "
        "field of status.progress (epoch, step, totalSteps, worldSize, groups, heldAtStep, "
        "loss, samplesPerSecond, lastCheckpoint, updatedAt); status.progress keeps the last valid"
        " report"
    ]
    assert records.latest(("ns", "j"), "u-1", bad, None) == (None, [])  # said once
