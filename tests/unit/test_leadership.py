"""Leader election without a server: what a replica does with the Lease as read, when a leader
may write, the Lease it writes, and the arithmetic that keeps two leaders from acting at once."""

from __future__ import annotations

import datetime as dt
import itertools

import pytest

from ddp_operator.leadership import (
    Durations,
    Held,
    Move,
    Seen,
    acting,
    decide,
    lease_body,
    seen,
)
from ddp_operator.settings import Settings

D = Durations()  # 15 s lease, 10 s renew deadline, 2 s retry


def held(holder: str, version: str = "1", lease_s: float = 15.0) -> Held:
    return Held(holder, lease_s, version)


def test_a_replica_creates_renews_takes_or_waits() -> None:
    assert decide(None, "me", None, 0.0) is Move.CREATE
    assert decide(held("me"), "me", None, 0.0) is Move.RENEW  # ours, even if we forgot it
    assert decide(held(""), "me", None, 0.0) is Move.TAKE  # released by a leader that stopped
    # Another's: the clock starts when this version is first read, never from its renewTime.
    first = seen(held("other"), None, 100.0)
    assert first == Seen("1", 100.0)
    assert decide(held("other"), "me", first, 100.0) is Move.WAIT
    assert decide(held("other"), "me", first, 114.9) is Move.WAIT
    assert decide(held("other"), "me", first, 115.0) is Move.TAKE
    # Renewed meanwhile: a new version, a new clock.
    later = seen(held("other", "2"), first, 114.0)
    assert later == Seen("2", 114.0)
    assert decide(held("other", "2"), "me", later, 120.0) is Move.WAIT
    assert seen(held("other", "2"), later, 125.0) is later  # unchanged: the clock runs on
    assert decide(held("other", "2"), "me", later, 129.0) is Move.TAKE
    assert seen(None, later, 130.0) is None


def test_the_holder_s_promised_lease_is_waited_not_ours() -> None:
    memory = Seen("7", 0.0)
    assert decide(held("other", "7", lease_s=30.0), "me", memory, 20.0) is Move.WAIT
    assert decide(held("other", "7", lease_s=30.0), "me", memory, 30.0) is Move.TAKE
    lease = {"metadata": {"resourceVersion": "7"}, "spec": {"holderIdentity": "x"}}
    assert Held.of(lease, 15.0) == Held("x", 15.0, "7")  # no duration written: ours


def test_a_leader_acts_only_until_its_renew_deadline() -> None:
    assert not acting(5.0, None, 10.0)
    assert acting(5.0, 0.0, 10.0)
    assert acting(9.999, 0.0, 10.0)
    assert not acting(10.0, 0.0, 10.0)


def test_durations_must_leave_the_leader_time_to_stop_first() -> None:
    assert D.problems() == []
    assert Durations(10, 10, 2).problems() == [
        "the renew deadline must be positive and shorter than the lease"
    ]
    assert Durations(15, 10, 10).problems() == [
        "the retry period must be positive and shorter than the renew deadline"
    ]


def test_no_two_replicas_act_at_once_while_clock_rates_differ_by_less_than_20_percent() -> None:
    """The safety argument of docs/design.md, run: a leader's last renewal is sent at real time
    0 and lands at ``land``; a candidate polls every retry period from some phase, reads the
    Lease after it landed, and takes it when :func:`decide` says so. The leader stops acting
    when :func:`acting` says so on its own clock. Clocks run at rates 0.9 to 1.1 (15 / 10 would
    allow 1.2); the candidate must never take the Lease while the leader still acts."""
    for leader_rate, candidate_rate, land, phase in itertools.product(
        (0.9, 1.0, 1.1), (0.9, 1.0, 1.1), (0.0, 0.3, 1.9), (0.0, 0.7, 1.99)
    ):
        # The leader's monotonic clock reads 0 at the send; it acts until real time:
        stops = next(t / 100 for t in range(10_000) if not acting(leader_rate * t / 100, 0.0, 10))
        memory = None
        lease = held("leader")
        for poll in range(200):
            real = phase + poll * D.retry_s / candidate_rate
            if real < land:
                continue  # read before the renewal landed: an older version, not this one
            now = real * candidate_rate
            memory = seen(lease, memory, now)
            if decide(lease, "candidate", memory, now) is Move.TAKE:
                assert real > stops, (leader_rate, candidate_rate, land, phase, real, stops)
                break
        else:
            pytest.fail("the candidate never took the Lease")


def test_the_lease_written_to_renew_take_and_release() -> None:
    t0 = dt.datetime(2026, 11, 26, 12, 0, 0, 123456, tzinfo=dt.UTC)
    created = lease_body("ddp-operator", "ddp-system", "a", D, t0)
    assert created == {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "ddp-operator", "namespace": "ddp-system"},
        "spec": {
            "holderIdentity": "a",
            "leaseDurationSeconds": 15,
            "renewTime": "2026-11-26T12:00:00.123456Z",
            "acquireTime": "2026-11-26T12:00:00.123456Z",
        },
    }
    stored = {**created, "metadata": {**created["metadata"], "resourceVersion": "41"}}
    t1 = t0 + dt.timedelta(seconds=2)
    renewed = lease_body("ddp-operator", "ddp-system", "a", D, t1, stored)
    assert renewed["metadata"]["resourceVersion"] == "41"  # conditional: a 409 if it changed
    assert renewed["spec"]["acquireTime"] == created["spec"]["acquireTime"]
    assert renewed["spec"]["renewTime"] == "2026-11-26T12:00:02.123456Z"
    assert "leaseTransitions" not in renewed["spec"]
    taken = lease_body("ddp-operator", "ddp-system", "b", D, t1, stored)
    assert taken["spec"]["holderIdentity"] == "b" and taken["spec"]["leaseTransitions"] == 1
    assert taken["spec"]["acquireTime"] == taken["spec"]["renewTime"]
    released = lease_body("ddp-operator", "ddp-system", "", D, t1, stored)
    assert "holderIdentity" not in released["spec"] and "acquireTime" not in released["spec"]
    assert released["spec"]["leaseDurationSeconds"] == 1
    after = {**released, "metadata": {**released["metadata"], "resourceVersion": "42"}}
    retaken = lease_body("ddp-operator", "ddp-system", "b", D, t1, after)
    assert "leaseTransitions" not in retaken["spec"]  # from nobody: not a transition
    short = lease_body("l", "ns", "a", Durations(1.2, 1.1, 0.5), t0)
    assert short["spec"]["leaseDurationSeconds"] == 2  # never less than the lease waited


def test_leader_election_settings_are_read_and_unsafe_ones_refused() -> None:
    s = Settings.from_env({})
    assert s.leader_election and s.lease_name == "ddp-operator" and s.lease == D
    assert s.identity == ""  # made at start: hostname and a random suffix
    s = Settings.from_env(
        {"DDP_LEASE_DURATION_S": "6", "DDP_RENEW_DEADLINE_S": "4", "DDP_RETRY_PERIOD_S": "0.5",
         "DDP_LEADER_ELECTION": "false", "DDP_LEADER_IDENTITY": "pod-1",
         "DDP_LEASE_NAME": "l", "DDP_LEASE_NAMESPACE": "ops"}
    )  # fmt: skip
    assert s.lease == Durations(6, 4, 0.5) and not s.leader_election
    assert (s.identity, s.lease_name, s.lease_namespace) == ("pod-1", "l", "ops")
    with pytest.raises(
        ValueError, match="DDP_RENEW_DEADLINE_S=15, DDP_RETRY_PERIOD_S=2: the renew deadline"
    ):
        Settings.from_env({"DDP_RENEW_DEADLINE_S": "15"})
    with pytest.raises(ValueError, match="DDP_LEADER_ELECTION='maybe' must be true or false"):
        Settings.from_env({"DDP_LEADER_ELECTION": "maybe"})
