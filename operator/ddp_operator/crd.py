"""The DDPJob CustomResourceDefinition, generated from the pydantic models in ``ddpjob.py``.

``python -m ddp_operator.crd > manifests/crd/ddp.dev_ddpjobs.yaml`` regenerates the committed file.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

import yaml

from ddp_api import contract, ddpjob

CRD_FILE = "manifests/crd/ddp.dev_ddpjobs.yaml"
REGENERATE = f"python -m ddp_operator.crd > {CRD_FILE}"

# Keys of pydantic's JSON schema that a structural OpenAPI v3 schema does without.
_DROPPED = {"title", "$defs"}
# Key order in the output, so the YAML reads description-first; the rest keep their order.
_ORDER = ("description", "type", "format", "default", "enum", "minimum", "maximum")

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Ready", "type": "string", "jsonPath": ".status.ready"},
    {"name": "Reason", "type": "string", "jsonPath": ".status.reason"},
    {"name": "Epoch", "type": "integer", "jsonPath": ".status.progress.epoch"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
    {"name": "Loss", "type": "number", "jsonPath": ".status.progress.loss"},
    {
        "name": "Groups",
        "type": "integer",
        "description": "Replica groups that trained the last step (PerStep mode)",
        "jsonPath": ".status.progress.groups",
    },
    {
        "name": "Checkpoint",
        "type": "string",
        "jsonPath": ".status.progress.lastCheckpoint",
        "priority": 1,
    },
    {
        "name": "ETA",
        "type": "string",
        "description": "Estimated time until the last step (5m07s)",
        "jsonPath": ".status.progress.eta",
        "priority": 1,
    },
    {
        "name": "Restarts",
        "type": "integer",
        "description": "Failures counted against spec.backoffLimit",
        "jsonPath": ".status.restarts",
        "priority": 1,
    },
    {
        "name": "Disruptions",
        "type": "integer",
        "description": "Node pods lost to a disruption (never against backoffLimit)",
        "jsonPath": ".status.disruptions",
        "priority": 1,
    },
    {
        "name": "Goodput",
        "type": "number",
        "description": "Share of the job's training time in steps that were kept",
        "jsonPath": ".status.goodput",
        "priority": 1,
    },
    {"name": "Queue", "type": "string", "jsonPath": ".status.queue", "priority": 1},
    {"name": "ClusterQueue", "type": "string", "jsonPath": ".status.clusterQueue", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def structural(node: Any, defs: dict[str, Any]) -> Any:
    """pydantic's JSON schema -> a structural OpenAPI v3 schema: ``$ref``s inlined, titles
    dropped, ``anyOf [X, null]`` turned into X, ``additionalProperties: false`` left to pruning.
    """
    if isinstance(node, list):
        return [structural(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    if "$ref" in node:
        out.update(structural(defs[node["$ref"].rsplit("/", 1)[-1]], defs))
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b != {"type": "null"}]
        if len(branches) != 1:
            raise ValueError(f"a union other than X | None has no structural schema: {node}")
        out.update(structural(branches[0], defs))
    for key, value in node.items():
        if key in _DROPPED or key in ("$ref", "anyOf"):
            continue
        if key == "additionalProperties" and value is False:
            continue  # unknown fields are pruned or, with --validate=strict, refused
        if key == "default" and value is None:
            continue
        if key == "description":
            out[key] = " ".join(value.split())
        elif key == "properties":
            out[key] = {name: structural(p, defs) for name, p in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = structural(value, defs)
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            # JSON Schema's numeric bound is OpenAPI v3.0's bound plus a boolean flag.
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        else:
            out[key] = copy.deepcopy(value)  # the field's own description/default win
    if "const" in out or "oneOf" in out or "allOf" in out:
        raise ValueError(f"no structural schema for {node}")
    first = {k: out.pop(k) for k in _ORDER if k in out}
    return {**first, **out}


def openapi_schema() -> dict[str, Any]:
    """The openAPIV3Schema of the DDPJob kind."""
    raw = ddpjob.DDPJob.model_json_schema(by_alias=True, mode="validation")
    # The API server owns these three; their schema is the same for every kind.
    for name in ("apiVersion", "kind", "metadata"):
        del raw["properties"][name]
    schema: dict[str, Any] = structural(raw, raw.get("$defs", {}))
    schema["properties"] = {
        "apiVersion": {
            "description": f"APIVersion of this object: {contract.API_VERSION}.",
            "type": "string",
        },
        "kind": {"description": f"Kind of this object: {contract.KIND}.", "type": "string"},
        "metadata": {"type": "object"},
        **schema["properties"],
    }
    return schema


def crd_manifest() -> dict[str, Any]:
    """The CustomResourceDefinition of ddpjobs.ddp.dev, as a plain dict."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{contract.PLURAL}.{contract.GROUP}"},
        "spec": {
            "group": contract.GROUP,
            "names": {
                "kind": contract.KIND,
                "listKind": f"{contract.KIND}List",
                "plural": contract.PLURAL,
                "singular": ddpjob.SINGULAR,
                "shortNames": list(ddpjob.SHORT_NAMES),
                "categories": list(ddpjob.CATEGORIES),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": contract.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.nodes",
                            "statusReplicasPath": ".status.nodes",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": copy.deepcopy(PRINTER_COLUMNS),
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = f"# Generated from api/ddp_api/ddpjob.py by `{REGENERATE}`; do not edit.\n"
    return header + yaml.safe_dump(crd_manifest(), sort_keys=False, width=100)


def main() -> int:
    sys.stdout.write(crd_yaml())
    return 0


if __name__ == "__main__":
    sys.exit(main())
