"""The few pure helpers of the operator's I/O shell."""

from __future__ import annotations

from ddp_operator import handlers, kube, render


def test_retries_follow_retry_after_then_double_and_are_capped() -> None:
    assert kube.retry_delay_s(1, "2") == 2.0
    assert kube.retry_delay_s(1, "120") == 10.0  # a server's long wait is capped
    assert [kube.retry_delay_s(n, None) for n in (1, 2, 3)] == [0.1, 0.2, 0.4]
    assert kube.retry_delay_s(20, None) == 3.2
    assert kube.retry_delay_s(2, "soon") == 0.2  # unreadable: our own backoff


def test_our_last_status_write_wins_over_a_staler_watched_status() -> None:
    watched = {"phase": "Running", "restarts": 0, "startTime": "t", "progress": {"step": 9}}
    ours = {"phase": "Restarting", "restarts": 1, "startTime": None}
    merged = handlers._merged(watched, ours)
    assert merged == {"phase": "Restarting", "restarts": 1, "progress": {"step": 9}}
    assert handlers._merged(watched, None) == watched


def test_objects_go_to_their_collections() -> None:
    rbac = render.trainer_role_binding("team")
    assert kube.path_of(rbac) == ("/apis/rbac.authorization.k8s.io/v1/namespaces/team/rolebindings")
    sa = render.trainer_service_account("team")
    assert kube.path_of(sa) == "/api/v1/namespaces/team/serviceaccounts"
    assert kube.group_path("ddp.dev/v1alpha1", "team", "ddpjobs", "x") == (
        "/apis/ddp.dev/v1alpha1/namespaces/team/ddpjobs/x"
    )
