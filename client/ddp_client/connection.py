"""The client's connection to one namespace of one cluster: the kubeconfig (or the pod's own
account) it loads, and the one-line errors it makes of what the Kubernetes client raises."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ddp_api.contract import GROUP, PLURAL, VERSION

from .errors import ApiError, ClusterUnreachable, DDPError, JobNotFound, one_line

REQUEST_TIMEOUT = (10, 60)  # seconds to connect, and to read one response
DEFAULT_KUBECONFIG = "~/.kube/config"


class Connection:
    """The Kubernetes API of one namespace of one cluster. ``namespace`` defaults to the
    kubeconfig context's, else ``default``."""

    def __init__(
        self,
        namespace: str | None = None,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
    ) -> None:
        from kubernetes import client, config

        configuration = client.Configuration()
        files = kubeconfig or os.environ.get("KUBECONFIG") or ""
        if not files and Path(DEFAULT_KUBECONFIG).expanduser().exists():
            files = str(Path(DEFAULT_KUBECONFIG).expanduser())
        in_pod = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        if files and not any(Path(f).expanduser().exists() for f in files.split(os.pathsep)):
            raise ClusterUnreachable(f"no kubeconfig at {files}")
        if not files and not in_pod:
            raise ClusterUnreachable(
                f"no cluster configured: set KUBECONFIG or --kubeconfig (there is no"
                f" {DEFAULT_KUBECONFIG}, and this is not a pod)"
            )
        try:
            if files:
                config.load_kube_config(
                    config_file=files, context=context, client_configuration=configuration
                )
                context_namespace = _context_namespace(config, files, context)
            else:
                config.load_incluster_config(client_configuration=configuration)
                context_namespace = _incluster_namespace()
        except config.ConfigException as error:
            raise ClusterUnreachable(f"cannot use the kubeconfig: {one_line(str(error))}") from None
        except OSError as error:
            raise ClusterUnreachable(f"cannot read the kubeconfig: {error}") from None
        self.namespace = namespace or context_namespace or "default"
        self.server = str(configuration.host)
        self._api = client.ApiClient(configuration)
        self._core = client.CoreV1Api(self._api)
        self._custom = client.CustomObjectsApi(self._api)
        self._models = client

    # -- errors ------------------------------------------------------------------------------
    @contextmanager
    def _calls(self, job: str | None = None) -> Iterator[None]:
        """Turns what the Kubernetes client raises into one-line DDPErrors."""
        import urllib3
        from kubernetes.client.exceptions import ApiException

        try:
            yield
        except ApiException as error:
            raise self._api_error(error, job) from None
        except urllib3.exceptions.HTTPError as error:
            reason = getattr(error, "reason", None) or error
            text = re.sub(r"^\S+\(host=[^)]*\): ", "", one_line(str(reason)))
            text = text.removeprefix("Failed to establish a new connection: ")
            raise ClusterUnreachable(f"cannot reach the cluster at {self.server}: {text}") from None

    def _api_error(self, error: Any, job: str | None) -> DDPError:
        try:
            body = json.loads(error.body or "{}")
        except (TypeError, ValueError):
            body = {}
        message = one_line(str(body.get("message") or error.reason or error))
        details = body.get("details") or {}
        if error.status == 404 and job is not None and details.get("kind") == PLURAL:
            return JobNotFound(f'ddpjob "{job}" not found in namespace "{self.namespace}"')
        if error.status == 404 and job is not None:
            return DDPError(
                f"the cluster has no DDPJob API ({PLURAL}.{GROUP}/{VERSION}): install the"
                " operator's CRD (kubectl apply --server-side -k manifests/)"
            )
        if error.status in (401, 403):
            return ApiError(f"not allowed: {message}", error.status)
        return ApiError(message, int(error.status or 0))


def _context_namespace(config: Any, kubeconfig: str, context: str | None) -> str | None:
    contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
    chosen = next((c for c in contexts if c.get("name") == context), active) if context else active
    return ((chosen or {}).get("context") or {}).get("namespace")


def _incluster_namespace() -> str | None:
    path = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    try:
        return path.read_text().strip() or None
    except OSError:
        return None
