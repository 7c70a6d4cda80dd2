"""The pod cache against a real API server: list, watch, resume, and list again after a 410."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

import kopf
import pytest
import yaml

from ddp_devcluster.plane import ControlPlane
from ddp_operator import informer, kube, render
from ddp_operator.planner import views

pytestmark = pytest.mark.controlplane


def pod(name: str, job: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": {render.LABEL_JOB: job, render.LABEL_ROLE: "worker"},
            },
            # No node has this label: the pod stays Pending, and only the API matters here.
            "spec": {
                "nodeSelector": {"ddp.dev/nowhere": "true"},
                "containers": [{"name": "c", "image": "none"}],
            },
        }
    )


async def until(what: str, ok: Callable[[], bool], timeout_s: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not ok():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def test_the_cache_follows_creates_and_deletes_across_resumed_and_expired_watches(
    control_plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp = control_plane
    ns = f"inf-{uuid.uuid4().hex[:8]}"
    cp.kubectl("create", "namespace", ns)
    cp.kubectl("apply", "-n", ns, "-f", "-", input=pod("early", "a"))  # there before the LIST
    monkeypatch.setenv("KUBECONFIG", str(cp.kubeconfig))
    log = logging.getLogger("test")

    async def scenario() -> None:
        api = kube.Kube(
            lambda: kube.login(logger=log, settings=kopf.OperatorSettings()), concurrency=4
        )
        cache = informer.Cache(render.LABEL_JOB, views.view)
        changed: list[informer.Key] = []
        w = informer.Informer(api, "pods", ns, cache, changed.append, watch_s=2)
        task = asyncio.create_task(w.run())
        try:
            await asyncio.wait_for(w.synced.wait(), 20)
            assert set(cache.kept((ns, "a"))) == {"early"} and changed == [(ns, "a")]
            assert w.following and await api.ready(2.0)  # what the machines part hears by

            await asyncio.to_thread(cp.kubectl, "apply", "-n", ns, "-f", "-", input=pod("x", "b"))
            await until("the created pod", lambda: set(cache.kept((ns, "b"))) == {"x"})
            assert changed[-1] == (ns, "b")

            # The server ends each watch after 2 s; it is resumed from where it was, not listed.
            await until("a resumed watch", lambda: w.watches >= 3, timeout_s=15)
            assert w.lists == 1
            await asyncio.to_thread(cp.kubectl, "delete", "pod", "early", "-n", ns, "--wait=false")
            await until("the deletion", lambda: (ns, "a") not in cache.by_job)

            # A version the server no longer serves (410 Gone) is answered by a new LIST, and
            # what changed meanwhile is found by comparing it with the cache. A young API server
            # replays every past version from its watch cache, so the 410 itself is injected.
            real_watch = w.watch

            async def expired_once() -> None:
                monkeypatch.setattr(w, "watch", real_watch)
                raise informer.Expired("too old resource version")

            cache.apply("ADDED", {"metadata": {"namespace": ns, "name": "ghost",
                                               "labels": {render.LABEL_JOB: "g"}}})  # fmt: skip
            monkeypatch.setattr(w, "watch", expired_once)
            await until("a second LIST", lambda: w.lists == 2, timeout_s=15)
            assert (ns, "g") not in cache.by_job and changed[-1] == (ns, "g")
            assert set(cache.kept((ns, "b"))) == {"x"}

            # A watch that fails is not following while it backs off, and follows again once a
            # watch is open (here one the server ends after 2 s, nothing having changed).
            failed = asyncio.Event()

            async def reset_once() -> None:
                monkeypatch.setattr(w, "watch", held_then_real)
                raise ConnectionResetError("the API server's machine powered off")

            async def held_then_real() -> None:
                failed.set()
                await asyncio.sleep(0.5)  # the retry's watch, held: the failure's state is seen
                await real_watch()

            monkeypatch.setattr(w, "watch", reset_once)
            await asyncio.wait_for(failed.wait(), 15)
            assert not w.following
            await until("following again", lambda: w.following, timeout_s=15)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await api.close()

    asyncio.run(scenario())


def test_watches_do_not_take_the_slots_of_requests(
    control_plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator that may only watch namespace by namespace holds a watch a resource and
    namespace; however many, its requests still go through (before, each watch took one of
    ``concurrency + 4`` connections, and the 5th namespace's watches starved every request)."""
    cp = control_plane
    namespaces = [f"slots-{uuid.uuid4().hex[:6]}-{i}" for i in range(4)]
    for ns in namespaces:
        cp.kubectl("create", "namespace", ns)
    monkeypatch.setenv("KUBECONFIG", str(cp.kubeconfig))
    log = logging.getLogger("test")

    async def scenario() -> None:
        api = kube.Kube(
            lambda: kube.login(logger=log, settings=kopf.OperatorSettings()), concurrency=1
        )
        caches = [informer.Cache(render.LABEL_JOB, views.view) for _ in range(2 * len(namespaces))]
        watches = [
            informer.Informer(api, plural, ns, caches[i], lambda key: None, watch_s=60)
            for i, (plural, ns) in enumerate(
                (p, ns) for ns in namespaces for p in ("pods", "services")
            )
        ]
        tasks = [asyncio.create_task(w.run()) for w in watches]
        try:
            for w in watches:  # eight watches open at once, each on a connection of its own
                await asyncio.wait_for(w.synced.wait(), 20)
            r = await asyncio.wait_for(api.call("GET", kube.core_path(namespaces[0], "pods")), 10)
            assert r.ok, r.message
            made = await asyncio.wait_for(
                asyncio.gather(
                    *(api.call("GET", kube.core_path(ns, "services")) for ns in namespaces)
                ),
                10,
            )
            assert all(m.ok for m in made)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await api.close()

    asyncio.run(scenario())
