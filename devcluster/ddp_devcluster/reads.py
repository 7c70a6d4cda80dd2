"""The harness's reads in this process: ``kubectl get KIND [NAME] [-l SEL] [--field-selector
SEL] -o json`` of the kinds the tests poll, as one GET on the API server instead of a kubectl
process (about 0.1 s of a core each, several a second while a test waits on two cores).

:func:`route` decides, without I/O, whether a ``get``'s arguments are such a read and which
path and query they ask for; anything else (another kind, another flag) is left to kubectl.
:class:`Reader` does the GET and answers as kubectl's JSON does: a list's items carry their
``kind`` and ``apiVersion``, and a missing object is None.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from ddp_api.contract import GROUP, PLURAL, VERSION


class Resource(NamedTuple):
    api: str  # "api/v1" or "apis/<group>/<version>"
    plural: str
    kind: str
    namespaced: bool


_CORE = "api/v1"
RESOURCES: dict[str, Resource] = {
    name: resource
    for resource, names in (
        (Resource(_CORE, "pods", "Pod", True), ("pod", "pods", "po")),
        (Resource(_CORE, "events", "Event", True), ("event", "events", "ev")),
        (Resource(_CORE, "nodes", "Node", False), ("node", "nodes", "no")),
        (Resource(_CORE, "namespaces", "Namespace", False), ("namespace", "namespaces", "ns")),
        (Resource(_CORE, "persistentvolumeclaims", "PersistentVolumeClaim", True), ("pvc",)),
        (Resource(f"apis/{GROUP}/{VERSION}", PLURAL, "DDPJob", True), ("ddpjob", PLURAL)),
        (Resource("apis/coordination.k8s.io/v1", "leases", "Lease", True), ("lease", "leases")),
    )
    for name in names
}
_SELECTORS = {"-l": "labelSelector", "--selector": "labelSelector",
              "--field-selector": "fieldSelector"}  # fmt: skip


class Route(NamedTuple):
    resource: Resource
    path: str
    query: tuple[tuple[str, str], ...]
    one: bool  # a named object, not a list


def route(args: tuple[str, ...], ns: str) -> Route | None:
    """The GET that ``kubectl get ARGS -o json`` in namespace ``ns`` ("": kubectl's
    ``default``) makes, or None where kubectl should run (any other form)."""
    if not args or args[0] not in RESOURCES:
        return None
    resource, rest = RESOURCES[args[0]], list(args[1:])
    name = rest.pop(0) if rest and not rest[0].startswith("-") else ""
    query: list[tuple[str, str]] = []
    while rest:
        flag = rest.pop(0)
        if flag not in _SELECTORS or not rest:
            return None
        query.append((_SELECTORS[flag], rest.pop(0)))
    if "/" in name or (name and query):
        return None
    scope = f"/namespaces/{ns or 'default'}" if resource.namespaced else ""
    path = f"/{resource.api}{scope}/{resource.plural}" + (f"/{name}" if name else "")
    return Route(resource, path, tuple(query), bool(name))


def as_kubectl(route: Route, body: dict[str, Any]) -> dict[str, Any]:
    """The API server's answer as kubectl prints it: each item of a list has its kind."""
    if route.one:
        return body
    api_version = route.resource.api.removeprefix("api/").removeprefix("apis/")
    items = [{"apiVersion": api_version, "kind": route.resource.kind, **item}
             for item in body.get("items") or []]  # fmt: skip
    return {"apiVersion": "v1", "kind": "List", "items": items,
            "metadata": {"resourceVersion": ""}}  # fmt: skip


class NotReadable(Exception):
    """The API server refused the GET or could not be reached; ``status`` is its HTTP status
    (0 where there was no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Reader:
    """GETs on the cluster of one kubeconfig, with one connection pool; the kubeconfig is read
    again when its file changed (a cluster made anew under the same path)."""

    kubeconfig: Path
    timeout_s: float = 30
    _client: Any = None
    _stamp: float = -1.0

    def _api(self) -> Any:
        stamp = self.kubeconfig.stat().st_mtime
        if self._client is None or stamp != self._stamp:
            from kubernetes import client, config

            configuration = client.Configuration()
            config.load_kube_config(str(self.kubeconfig), client_configuration=configuration)
            self._client, self._stamp = client.ApiClient(configuration), stamp
        return self._client

    def get(self, route: Route) -> dict[str, Any] | None:
        """The object or list (as :func:`as_kubectl`), None where there is no such object."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        api = self._api()
        method, url, headers, _, _ = api.param_serialize(
            "GET", route.path, query_params=list(route.query),
            header_params={"Accept": "application/json"}, auth_settings=["BearerToken"],
        )  # fmt: skip
        try:
            response = api.call_api(method, url, header_params=headers,
                                    _request_timeout=self.timeout_s)  # fmt: skip
            body = response.read()
        except ApiException as e:
            raise NotReadable(e.status or 0, f"GET {route.path}: {e.status} {e.reason}") from e
        except (HTTPError, OSError) as e:
            raise NotReadable(0, f"GET {route.path}: {e}") from e
        if response.status == 404 and route.one:
            return None
        if response.status != 200:
            raise NotReadable(response.status, f"GET {route.path}: {response.status}")
        return as_kubectl(route, json.loads(body))
