"""The kind cluster as the tests see it (the harness on its kubeconfig), what this machine must
have to run it, and the session's one cluster for the tiers that run on it (the cluster suite,
the demo and the end-to-end scenarios): made unless one is up already, and deleted after the
last test that uses it when this session made it, so that the tests after it do not share the
two cores with four idle machines."""

from __future__ import annotations

from collections.abc import Iterator

from ddp_devcluster.harness import Harness
from ddp_devcluster.kind import cluster as kind
from ddp_devcluster.kind.lock import hold
from ddp_devcluster.pytest_plugin import unavailable, until_last_use


class KindCluster(Harness):
    """The harness on the kind cluster's kubeconfig."""

    timeout_s = 120


def requirements() -> None:
    why = kind.requirements()
    if why:
        unavailable(f"the kind cluster cannot start here: {why}")


def _log(msg: str) -> None:
    print(f"\n[kind] {msg}", flush=True)


def session_cluster() -> Iterator[KindCluster]:
    """The body of the ``kind_cluster`` fixture (tests/conftest.py)."""
    requirements()
    # Held from before `up` to after the last test (and `down`): a second session, the demo or
    # `make down` elsewhere on this machine waits instead of changing the cluster under it.
    release = hold(kind.NAME, "the tests", log=_log)
    before = kind.instance()

    def done() -> None:
        try:
            if kind.instance() != before:  # made, or made anew in place of a broken one
                kind.down(log=_log)
        finally:
            release()

    try:
        kubeconfig = kind.up(log=_log)
    except BaseException:
        done()
        raise
    finish = until_last_use("kind_cluster", done)
    yield KindCluster(kubeconfig)
    finish()
