"""The generated CRD: committed copy up to date, a structural schema, a description everywhere."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddp_api import ddpjob as api
from ddp_operator.crd import CRD_FILE, REGENERATE, crd_manifest, crd_yaml, structural

ROOT = Path(__file__).resolve().parents[2]
TYPES = {"object", "array", "string", "integer", "number", "boolean"}


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node below ``node``, with a path such as ``.spec.checkpoint.volume``."""
    yield path, node
    for name, prop in node.get("properties", {}).items():
        yield from walk(prop, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


def resolve(schema: dict[str, Any], json_path: str) -> dict[str, Any]:
    node = schema
    for part in json_path.strip(".").split("."):
        node = node["properties"][part]
    return node


def test_the_committed_crd_is_up_to_date() -> None:
    committed = (ROOT / CRD_FILE).read_text()
    assert committed == crd_yaml(), f"{CRD_FILE} is stale: run `{REGENERATE}`"


def test_the_schema_is_structural(schema: dict[str, Any]) -> None:
    for path, node in walk(schema):
        where = path or "<root>"
        for key in ("$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "const", "title"):
            assert key not in node, f"{where} has {key}"
        assert node.get("additionalProperties") is not False, where
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node, where
        else:
            assert node.get("type") in TYPES, f"{where} has no type"
        if node.get("x-kubernetes-preserve-unknown-fields"):
            # Only core Kubernetes objects we pass through keep unknown fields.
            assert "properties" not in node, where
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            assert node.get(bound, True) is True, f"{where}: {bound} must be a boolean"


def test_the_levels_we_own_refuse_unknown_fields(schema: dict[str, Any]) -> None:
    for path in [".spec", ".spec.trainer", ".spec.checkpoint", ".spec.template", ".status"]:
        node = resolve(schema, path)
        assert "x-kubernetes-preserve-unknown-fields" not in node, path
        assert node["properties"], path


def test_every_property_has_a_description(schema: dict[str, Any]) -> None:
    missing = [
        path
        for path, node in walk(schema)
        if path not in ("", ".metadata") and not path.endswith(("[]", "{}"))
        if not node.get("description", "").strip()
    ]
    assert not missing, f"properties without a description: {missing}"


def test_defaults_bounds_and_enums_survive(schema: dict[str, Any]) -> None:
    spec = resolve(schema, ".spec")
    nodes = spec["properties"]["nodes"]
    assert (nodes["type"], nodes["default"], nodes["minimum"]) == ("integer", 1, 1)
    assert spec["properties"]["restartPolicy"]["enum"] == ["OnFailure", "ExitCode", "Never"]
    assert spec["properties"]["restartPolicy"]["default"] == "OnFailure"
    assert spec["properties"]["spread"]["enum"] == ["Required", "Preferred", "None"]
    assert spec["properties"]["spread"]["default"] == "Preferred"
    nproc = spec["properties"]["nprocPerNode"]
    assert nproc["x-kubernetes-int-or-string"] is True and nproc["default"] == 1
    assert resolve(schema, ".spec.trainer.amp")["enum"] == ["auto", "bf16", "fp16", "off"]
    assert resolve(schema, ".spec.checkpoint.everySteps")["default"] == 100
    assert resolve(schema, ".spec.checkpoint")["required"] == ["volume"]
    volume = resolve(schema, ".spec.checkpoint.volume")
    assert volume["type"] == "object" and volume["x-kubernetes-preserve-unknown-fields"] is True
    lr = resolve(schema, ".spec.trainer.lr")
    assert (lr["minimum"], lr["exclusiveMinimum"]) == (0, True)
    assert resolve(schema, ".status.startTime")["format"] == "date-time"
    assert schema["required"] == ["spec"]


def test_every_pod_changing_field_has_an_immutability_rule(schema: dict[str, Any]) -> None:
    rules = resolve(schema, ".spec")["x-kubernetes-validations"]
    paths = {r.get("fieldPath") for r in rules if "oldSelf" in r["rule"]}
    for field in api.SPEC_IMMUTABLE_FIELDS:
        assert f".{field}" in paths, field
    # nodes has exactly one transition rule (only for jobs that are not elastic).
    assert [r["rule"] for r in rules if r.get("fieldPath") == ".nodes" and "oldSelf" in r["rule"]]
    for mutable in ("suspend", "backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished"):
        assert f".{mutable}" not in paths
    for rule in rules:
        assert rule.get("message") or rule.get("messageExpression"), rule


def test_names_subresources_and_printer_columns(schema: dict[str, Any]) -> None:
    crd = crd_manifest()
    assert crd["metadata"]["name"] == "ddpjobs.ddp.dev"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["singular"]) == ("DDPJob", "ddpjobs", "ddpjob")
    assert names["shortNames"] == ["ddpj"]
    assert crd["spec"]["scope"] == "Namespaced"
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    scale = version["subresources"]["scale"]
    assert scale == {
        "specReplicasPath": ".spec.nodes",
        "statusReplicasPath": ".status.nodes",
        "labelSelectorPath": ".status.selector",
    }
    for path in scale.values():
        resolve(schema, path)
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert list(columns) == [
        "Phase", "Ready", "Reason", "Epoch", "Step", "Loss", "Groups", "Checkpoint", "ETA",
        "Restarts", "Disruptions", "Goodput", "Queue", "ClusterQueue", "Age",
    ]  # fmt: skip
    for wide in (
        "Checkpoint",
        "ETA",
        "Restarts",
        "Disruptions",
        "Goodput",
        "Queue",
        "ClusterQueue",
    ):
        assert columns[wide]["priority"] == 1
    for column in columns.values():
        if not column["jsonPath"].startswith(".metadata"):
            assert resolve(schema, column["jsonPath"])["type"] == column["type"]


def test_a_union_other_than_optional_is_refused() -> None:
    with pytest.raises(ValueError, match="union"):
        structural({"anyOf": [{"type": "integer"}, {"type": "string"}]}, {})


def test_the_module_prints_the_crd_as_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    from ddp_operator.crd import main

    assert main() == 0
    assert yaml.safe_load(capsys.readouterr().out) == crd_manifest()
