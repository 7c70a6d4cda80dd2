"""The few Kubernetes API calls the operator makes, as plain asyncio HTTP on kopf's credentials.

kopf watches DDPJobs; this module writes (create, delete, patch status, post Events) and
streams the watches of :mod:`ddp_operator.informer`. It shares kopf's login (a ServiceAccount
token in a pod, a kubeconfig elsewhere) and its aiohttp, so the operator needs no thread pool
and no generated client, and bodies go out as the plain dicts the pure renderer made. A 401 (a
rotated ServiceAccount token) logs in again once and retries.

Every write of the controller goes through :meth:`Kube.call`, which sends none unless its gate
says this replica leads (:mod:`ddp_operator.leadership`): checked right before each attempt is
sent, after any wait for a slot or a retry, so no writer can go around it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import kopf

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
RETRIES = 6
RETRIED = (429, 500, 502, 503, 504)
log = logging.getLogger("ddp_operator")


def retry_delay_s(attempt: int, retry_after: str | None) -> float:
    """The server's Retry-After when it gives one (capped), else 0.1 s doubling to 3.2 s."""
    if retry_after is not None:
        with contextlib.suppress(ValueError):
            return min(float(retry_after), 10.0)
    return min(0.1 * 2 ** (attempt - 1), 3.2)


@dataclass(frozen=True)
class Response:
    status: int
    text: str

    @functools.cached_property
    def body(self) -> dict[str, Any]:
        """The answer as JSON, parsed when first read: most callers only need the status."""
        return _parsed(self.text)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def message(self) -> str:
        return str(self.body.get("message") or self.body or self.status)


async def until_idle(busy: Callable[[], object], timeout_s: float) -> None:
    """Returns once ``busy()`` is falsy (looked at every 20 ms), or after ``timeout_s``: a
    graceful stop's wait for what is in flight."""
    deadline = time.monotonic() + timeout_s
    while busy() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


class NotLeading(RuntimeError):
    """A write not sent: this replica cannot prove that it holds the leader Lease."""


class KubeError(RuntimeError):
    def __init__(self, method: str, path: str, response: Response):
        super().__init__(f"{method} {path}: {response.status} {response.message}")
        self.response = response


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In a pod, its ServiceAccount; elsewhere, $KUBECONFIG or ~/.kube/config."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


class Kube:
    """An aiohttp session to the API server with at most ``concurrency`` requests in flight,
    and its watches besides (each holds a connection for as long as it runs: one a resource,
    or one a resource and namespace where the operator may only watch namespaces one by one).
    A request other than a GET is sent only while ``may_write()`` (else :class:`NotLeading`).
    """

    def __init__(
        self,
        credentials: Callable[[], kopf.ConnectionInfo | None],
        concurrency: int,
        on_error: Callable[[str], None] = lambda code: None,
        may_write: Callable[[], bool] = lambda: True,
        attempts: int = RETRIES,
        user_agent: str = "ddp-operator",  # says which replica sent a request (audit logs)
    ):
        self._user_agent = user_agent
        self._credentials = credentials
        self._on_error = on_error  # told each non-2xx status code, or "transport"
        self._may_write = may_write
        self._attempts = attempts
        self._session: aiohttp.ClientSession | None = None
        self._server = ""
        self._lock = asyncio.Lock()
        self._slots = asyncio.Semaphore(concurrency)  # requests; watches are not counted
        self.writes_in_flight = 0

    async def _connect(self) -> aiohttp.ClientSession:
        async with self._lock:
            if self._session is None:
                info = self._credentials()
                if info is None:
                    raise RuntimeError("no Kubernetes credentials: not in a pod, no kubeconfig")
                headers = {"Accept": "application/json", "User-Agent": self._user_agent}
                if info.token:
                    headers["Authorization"] = f"{info.scheme or 'Bearer'} {info.token}"
                connector = aiohttp.TCPConnector(ssl=info.as_ssl_context(), limit=0)
                self._server = info.server.rstrip("/")
                self._session = aiohttp.ClientSession(
                    connector=connector,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=60),
                )
            return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> Response:
        data = None if body is None else json.dumps(body)
        relogged = False
        attempts, attempt = self._attempts, 0
        while True:
            attempt += 1
            session = await self._connect()
            try:
                async with self._slots:
                    if method != "GET" and not self._may_write():
                        raise NotLeading(f"{method} {path}: not sent, this replica does not lead")
                    status, text, retry_after = await self._send(session, method, path, data,
                                                                 content_type)  # fmt: skip
            except (aiohttp.ClientError, TimeoutError) as e:
                self._on_error("transport")
                if attempt == attempts:
                    raise
                log.warning("%s %s: %s; retrying", method, path, e)
                await asyncio.sleep(retry_delay_s(attempt, None))
                continue
            if status >= 300:
                self._on_error(str(status))
            if status == 401 and not relogged:
                relogged, attempt = True, attempt - 1
                await self.close()  # a rotated token: log in again (not counted as an attempt)
                continue
            if status in RETRIED and attempt < attempts:
                # Overload (429 from API priority and fairness) or a server hiccup.
                await asyncio.sleep(retry_delay_s(attempt, retry_after))
                continue
            return Response(status, text)

    async def _send(
        self, session: aiohttp.ClientSession, method: str, path: str, data: str | None, ctype: str
    ) -> tuple[int, str, str | None]:
        """One attempt: (status, body, Retry-After); counts the writes in flight."""
        write = method != "GET"
        self.writes_in_flight += write
        try:
            async with session.request(
                method,
                self._server + path,
                data=data,
                headers={"Content-Type": ctype} if data is not None else None,
            ) as r:
                return r.status, await r.text(), r.headers.get("Retry-After")
        finally:
            self.writes_in_flight -= write

    async def ready(self, timeout_s: float) -> bool:
        """Whether the API server answers ``/readyz`` within ``timeout_s``, ready (200; or 401
        and 403, where this account may not read it: Kubernetes' default RBAC lets every
        account, but a cluster may not; then the server answers at least): one try, not queued
        behind other requests (the machines part hears the cluster through it)."""
        try:
            session = await self._connect()
            timeout = aiohttp.ClientTimeout(total=timeout_s)
            async with session.get(self._server + "/readyz", timeout=timeout) as r:
                await r.read()
                return r.status in (200, 401, 403)
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def drained(self, timeout_s: float) -> None:
        """Returns once no write is in flight, or after ``timeout_s``."""
        await until_idle(lambda: self.writes_in_flight, timeout_s)

    async def stream(self, path: str, read_timeout_s: float) -> AsyncIterator[dict[str, Any]]:
        """GETs ``path`` as a stream of JSON objects, one a line (a watch), as they arrive.

        Raises :class:`KubeError` for an answer other than 2xx (after a 401 the next call logs
        in again), and the transport's errors as they come: a watch is resumed by its caller.
        """
        session = await self._connect()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=read_timeout_s)
        async with session.get(self._server + path, timeout=timeout) as r:
            if not 200 <= r.status < 300:
                if r.status == 401:
                    await self.close()
                raise KubeError("GET", path, Response(r.status, await r.text()))
            rest = b""
            # Not readline(): aiohttp limits a line's length, and one object can be large.
            async for chunk in r.content.iter_any():
                *lines, rest = (rest + chunk).split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)

    async def must(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        content_type: str = "application/json",
        ok: tuple[int, ...] = (),
    ) -> Response:
        """Like :meth:`call`, but raises :class:`KubeError` unless 2xx or one of ``ok``."""
        r = await self.call(method, path, body, content_type)
        if not r.ok and r.status not in ok:
            raise KubeError(method, path, r)
        return r


def _parsed(text: str) -> dict[str, Any]:
    try:
        parsed = json.loads(text) if text else {}
    except ValueError:
        return {"message": text[:500]}
    return parsed if isinstance(parsed, dict) else {}


def core_path(namespace: str, plural: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/{plural}" + (f"/{name}" if name else "")


def group_path(group_version: str, namespace: str, plural: str, name: str = "") -> str:
    return f"/apis/{group_version}/namespaces/{namespace}/{plural}" + (f"/{name}" if name else "")


def path_of(obj: dict[str, Any]) -> str:
    """The collection a namespaced object of one of the kinds the operator creates goes to."""
    kind, ns = obj["kind"], obj["metadata"]["namespace"]
    plural = {
        "Pod": "pods",
        "Service": "services",
        "ServiceAccount": "serviceaccounts",
        "ConfigMap": "configmaps",
        "Event": "events",
        "Role": "roles",
        "RoleBinding": "rolebindings",
    }[kind]
    version = obj["apiVersion"]
    return core_path(ns, plural) if version == "v1" else group_path(version, ns, plural)
