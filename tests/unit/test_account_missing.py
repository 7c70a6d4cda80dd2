"""A namespace deleted and made again under its name loses the trainer account this operator
process made in it: the refusal of a pod for want of it makes the next reconcile create it
again (found on kind: a test's namespace reused minutes later, its jobs' pods refused for ten
minutes until this)."""

from __future__ import annotations

import asyncio

from ddp_operator import informer, kube
from ddp_operator.actions import missing_account
from ddp_operator.planner import views
from ddp_operator.trainer_objects import TrainerObjects

REFUSED = (
    'pods "j-node-0" is forbidden: error looking up service account ns/ddp-trainer-progress:'
    ' serviceaccount "ddp-trainer-progress" not found'
)


def test_only_admission_s_missing_account_refusal_counts() -> None:
    assert missing_account(403, REFUSED)
    assert not missing_account(403, 'pods "x" is forbidden: exceeded quota: compute')
    assert not missing_account(409, REFUSED)


def test_a_missing_namespace_account_is_made_again_by_the_next_reconcile() -> None:
    async def scene() -> None:
        objects = TrainerObjects(
            informer.Cache("ddp.dev/job-name", views.view),
            kube.Kube(lambda: None, 1),
            asyncio.ensure_future,
        )
        made: list[str] = []

        async def post(what: str) -> None:
            made.append(what)

        objects._once(("namespace-account", "ns"), lambda: post("account"))
        objects._once(("namespace-rbac", "ns"), lambda: post("rbac"))
        objects.granted.add("ns")
        await asyncio.sleep(0)
        objects._once(("namespace-account", "ns"), lambda: post("account"))  # once: no repeat
        await asyncio.sleep(0)
        assert made == ["account", "rbac"]
        objects.account_missing("ns")
        assert "ns" not in objects.granted
        objects._once(("namespace-account", "ns"), lambda: post("account"))
        objects._once(("namespace-account", "other"), lambda: post("other"))
        await asyncio.sleep(0)
        assert made == ["account", "rbac", "account", "other"]

    asyncio.run(scene())
