"""The kind cluster as the tests see it (the harness on its kubeconfig), what this machine must
have to run it, and the session's one cluster for the tiers that run on it (the cluster suite,
the demo and the end-to-end scenarios): made unless one is up already, and deleted after the
last test that uses it when this session made it, so that the tests after it do not share the
two cores with four idle machines."""

from __future__ import annotations

from collections.abc import Callable, Iterator

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


_turn: list[Callable[[], None]] = []  # the session's hold, taken once its tests are collected


def take_turn(log: Callable[[str], None] = print) -> None:
    """Waits until no other process on this machine uses the kind cluster, and holds it for
    this session (until :func:`session_cluster` is done with it, or the process ends). Where
    the cluster cannot start, the fixture says why, test by test."""
    if kind.requirements():
        return
    _turn.append(hold(kind.NAME, "the tests", log=log))


def session_cluster(log: Callable[[str], None] = print) -> Iterator[KindCluster]:
    """The body of the ``kind_cluster`` fixture (tests/conftest.py)."""
    requirements()
    # Held from before `up` to after the last test (and `down`): a second session, the demo or
    # `make down` elsewhere on this machine waits instead of changing the cluster under it.
    release = hold(kind.NAME, "the tests", log=log)
    before = kind.instance()

    def done() -> None:
        try:
            if kind.instance() != before:  # made, or made anew in place of a broken one
                kind.down(log=log)
        finally:
            release()
            while _turn:
                _turn.pop()()

    try:
        kubeconfig = kind.up(log=log)
    except BaseException:
        done()
        raise
    finish = until_last_use("kind_cluster", done)
    yield KindCluster(kubeconfig)
    finish()
