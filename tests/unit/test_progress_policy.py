"""When the operator counts the trainers' admission policy as in force: only a policy that fails
closed and a binding of it that denies everywhere (anything less, and it grants nothing)."""

from __future__ import annotations

from typing import Any

import pytest

from ddp_operator.progress_policy import ProgressPolicy, binding_in_force, policy_in_force

NAME = "ddp-operator-trainer-progress"


def binding(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": NAME},
        "spec": {"policyName": NAME, "validationActions": ["Deny"], **spec},
    }


def test_a_policy_that_fails_closed_and_a_binding_that_denies_everywhere_are_in_force() -> None:
    assert policy_in_force({"spec": {"failurePolicy": "Fail"}})
    assert policy_in_force({"spec": {}})  # Fail is the API server's default
    assert not policy_in_force({"spec": {"failurePolicy": "Ignore"}})
    assert binding_in_force(binding())
    # What the API server fills in when matchResources is given empty: still everywhere.
    defaulted = {"namespaceSelector": {}, "objectSelector": {}, "matchPolicy": "Equivalent"}
    assert binding_in_force(binding(matchResources=defaulted))


@pytest.mark.parametrize(
    "spec",
    [
        {"validationActions": ["Audit"]},
        {"validationActions": ["Warn", "Audit"]},
        {"policyName": "another-policy"},
        {"matchResources": {"namespaceSelector": {"matchLabels": {"team": "a"}}}},
        {"matchResources": {"objectSelector": {"matchLabels": {"x": "y"}}}},
        {"matchResources": {"excludeResourceRules": [{"resources": ["pods"]}]}},
    ],
)
def test_a_binding_that_only_audits_or_leaves_anything_out_is_not(spec: dict[str, Any]) -> None:
    assert not binding_in_force(binding(**spec))


def test_the_policy_counts_only_once_both_are_seen_and_readable() -> None:
    seen = ProgressPolicy(name=NAME)
    assert not seen.in_force and "has not read it yet" in seen.why_not()
    seen.policies.apply("ADDED", {"metadata": {"name": NAME}, "spec": {}})
    seen.known.set()
    assert not seen.in_force
    assert seen.why_not() == f"there is no ValidatingAdmissionPolicyBinding {NAME}"
    seen.bindings.apply("ADDED", binding())
    assert seen.in_force and seen.why_not() == ""
    seen.unreadable = "403 Forbidden"
    assert not seen.in_force and "cannot read it" in seen.why_not()
