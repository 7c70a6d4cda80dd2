"""The operator's typed status (ddp_api.status.StatusFields) names exactly DDPJobStatus's fields,
and what it reads from the API server keeps only those."""

from __future__ import annotations

from ddp_api.ddpjob import DDPJobStatus
from ddp_api.status import FIELDS, StatusFields, status_fields


def test_the_typed_status_has_every_field_of_the_api_and_no_other() -> None:
    aliases = {f.alias or name for name, f in DDPJobStatus.model_fields.items()}
    assert aliases == set(StatusFields.__annotations__) == FIELDS


def test_a_status_read_from_the_server_keeps_the_known_fields_only() -> None:
    raw = {"phase": "Running", "restarts": 2, "writtenByAFutureVersion": True, "progress": None}
    assert status_fields(raw) == {"phase": "Running", "restarts": 2, "progress": None}
    assert status_fields(None) == {}


def test_kueue_s_admitted_count_is_its_own_field_beside_spec_nodes() -> None:
    status = DDPJobStatus.model_validate({"admittedNodes": 2, "nodes": 2})
    assert status.admitted_nodes == 2
    assert "admittedNodes" in DDPJobStatus.model_json_schema(by_alias=True)["properties"]
