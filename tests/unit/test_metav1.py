"""Owner references and condition timestamps: one rule each, for every object the operator and
the client build."""

from __future__ import annotations

from ddp_api import metav1

META = {"name": "digits", "namespace": "team", "uid": "u-1"}


def test_the_operators_objects_are_controlled_and_the_clients_merely_owned() -> None:
    ref = {"apiVersion": "ddp.dev/v1alpha1", "kind": "DDPJob", "name": "digits", "uid": "u-1"}
    assert metav1.owner_reference(META) == {**ref, "controller": True, "blockOwnerDeletion": True}
    assert metav1.owner_reference(META, controller=False) == ref


def test_last_transition_time_moves_only_when_the_status_flips() -> None:
    old = {"type": "Running", "status": "True", "lastTransitionTime": "t0"}
    assert metav1.transition_time(old, "True", "t1") == "t0"
    assert metav1.transition_time(old, "False", "t1") == "t1"
    assert metav1.transition_time(None, "True", "t1") == "t1"
    assert metav1.transition_time({"status": "True"}, "True", "t1") == "t1"  # it had none
