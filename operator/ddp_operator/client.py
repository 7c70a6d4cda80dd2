"""A typed Python client for DDPJobs: create one from a script or a spec, wait for it, stream
its nodes' merged logs, read its progress and the curves of its ``metrics.jsonl``.

    from ddp_operator.client import DDPClient, ScriptOptions

    ddp = DDPClient(namespace="team")  # $KUBECONFIG (or ~/.kube/config), else in-cluster
    name = ddp.submit_script("train.py", ScriptOptions(nodes=2, nproc_per_node=4))
    status = ddp.wait(name, timeout_s=3600, on_status=lambda s: print(s.phase))
    for line in ddp.logs(name, rank=0):
        print(line.show())  # [node-0 rank0] ...
    print(status.phase, ddp.progress(name))
    ddp.plot(name, "loss.png")  # needs spec.checkpoint: metrics.jsonl is read from there

``kubectl ddp`` (:mod:`ddp_operator.cli`) is this client with a command line. Install it with
the ``client`` extra: the ``kubernetes`` package is imported only when a client is made, so
the operator's image (which lacks it) still imports ``ddp_operator``. Every error a user can
cause is a :class:`DDPError` whose text is one line that says what to do.
"""

from __future__ import annotations

import json
import os
import queue
import re
import secrets
import string
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from ddp_trainer.config import validation_message
from ddp_trainer.contract import GROUP, PLURAL, VERSION
from ddp_trainer.progress import parse_run_log

from .api import TERMINAL_PHASES, DDPJob, DDPJobStatus, Progress
from .client_objects import (
    InvalidJob,
    ScriptOptions,
    metrics_reader_pod,
    reader_image,
    script_objects,
)
from .follow import (
    Curves,
    LiveMerge,
    LogLine,
    curves,
    merge_logs,
    parse_line,
    parse_pod_log,
    pick_rank,
)
from .metav1 import owner_reference
from .render import CONTAINER, LABEL_INDEX, selector

__all__ = [
    "ClusterUnreachable",
    "DDPClient",
    "DDPError",
    "JobNotFound",
    "NoMetrics",
    "Plot",
    "ScriptNotFound",
    "ScriptOptions",
    "WaitTimeout",
    "draw_curves",
    "read_script",
]

REQUEST_TIMEOUT = (10, 60)  # seconds to connect, and to read one response
POD_LIST_INTERVAL_S = 2.0  # how often `logs -f` looks for new pods
FOLLOW_HOLD_S = 1.0  # how long `logs -f` holds a line for earlier ones of other pods
API_PATIENCE_S = 60.0  # how long `wait` rides out an unreachable API server
SUFFIX_ALPHABET = string.ascii_lowercase + string.digits
DEFAULT_KUBECONFIG = "~/.kube/config"


class DDPError(Exception):
    """A failure the user can act on; its text is one line that says what is wrong."""


class JobNotFound(DDPError):
    pass


class ClusterUnreachable(DDPError):
    pass


class ScriptNotFound(DDPError):
    pass


class NoMetrics(DDPError):
    pass


class WaitTimeout(DDPError, TimeoutError):
    pass


@dataclass(frozen=True)
class Plot:
    """What :meth:`DDPClient.plot` drew: the curves and the number of lines on the figure."""

    path: Path
    curves: Curves
    lines: int


def read_script(path: str | Path) -> str:
    """The text of a script to submit; ScriptNotFound when there is none to read."""
    p = Path(path)
    if not p.exists():
        raise ScriptNotFound(f"no such script: {p}")
    if not p.is_file():
        raise ScriptNotFound(f"{p} is not a file: give the path of a Python script")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ScriptNotFound(f"{p} is not UTF-8 text: give the path of a Python script") from None
    except OSError as error:
        raise ScriptNotFound(f"cannot read {p}: {error.strerror}") from None


def _known(model: type[Any], data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` less the keys ``model`` does not declare (a newer operator may add some)."""
    names = {f.alias or n for n, f in model.model_fields.items()}
    return {k: v for k, v in data.items() if k in names}


def status_of(job: Mapping[str, Any]) -> DDPJobStatus:
    """A DDPJob's status as the API's model."""
    raw = _known(DDPJobStatus, job.get("status") or {})
    if isinstance(raw.get("progress"), Mapping):
        raw["progress"] = _known(Progress, raw["progress"])
    return DDPJobStatus.model_validate(raw)


def _one_line(text: str) -> str:
    return " ".join(text.split())


class DDPClient:
    """DDPJobs of one namespace of one cluster, through the Kubernetes API only (so it works
    on any cluster). ``namespace`` defaults to the kubeconfig context's, else ``default``."""

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
            raise ClusterUnreachable(
                f"cannot use the kubeconfig: {_one_line(str(error))}"
            ) from None
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
            text = re.sub(r"^\S+\(host=[^)]*\): ", "", _one_line(str(reason)))
            text = text.removeprefix("Failed to establish a new connection: ")
            raise ClusterUnreachable(f"cannot reach the cluster at {self.server}: {text}") from None

    def _api_error(self, error: Any, job: str | None) -> DDPError:
        try:
            body = json.loads(error.body or "{}")
        except (TypeError, ValueError):
            body = {}
        message = _one_line(str(body.get("message") or error.reason or error))
        details = body.get("details") or {}
        if error.status == 404 and job is not None and details.get("kind") == PLURAL:
            return JobNotFound(f'ddpjob "{job}" not found in namespace "{self.namespace}"')
        if error.status == 404 and job is not None:
            return DDPError(
                f"the cluster has no DDPJob API ({PLURAL}.{GROUP}/{VERSION}): install the"
                " operator's CRD (kubectl apply --server-side -k manifests/)"
            )
        if error.status in (401, 403):
            return DDPError(f"not allowed: {message}")
        return DDPError(message)

    # -- jobs --------------------------------------------------------------------------------
    def get(self, name: str) -> dict[str, Any]:
        """The DDPJob as the API returns it; JobNotFound when there is none."""
        with self._calls(job=name):
            obj = self._custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name, _request_timeout=REQUEST_TIMEOUT
            )
        return cast(dict[str, Any], obj)

    def status(self, name: str) -> DDPJobStatus:
        return status_of(self.get(name))

    def progress(self, name: str) -> Progress | None:
        """What rank 0 last reported (``status.progress``); None before its first report."""
        return self.status(name).progress

    def create_job(self, job: Mapping[str, Any] | DDPJob) -> str:
        """Creates a DDPJob from a whole object (``metadata.name`` or ``generateName``, and a
        ``spec``), checked against the API's model first; returns its name."""
        body = (
            job.model_dump(by_alias=True, exclude_none=True, mode="json")
            if isinstance(job, DDPJob)
            else dict(job)
        )
        body.setdefault("apiVersion", f"{GROUP}/{VERSION}")
        body.setdefault("kind", "DDPJob")
        body.pop("status", None)
        from pydantic import ValidationError

        try:
            DDPJob.model_validate(body)
        except ValidationError as error:
            message = validation_message(error, first_only=True, tidy=False)
            raise DDPError(f"invalid DDPJob: {message}") from None
        namespace = (body.get("metadata") or {}).get("namespace") or self.namespace
        with self._calls():
            created = self._custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, body, _request_timeout=REQUEST_TIMEOUT
            )
        return str(cast(dict[str, Any], created)["metadata"]["name"])

    def submit_script(self, script: str | Path, options: ScriptOptions | None = None) -> str:
        """Runs a script under torchrun: a ConfigMap holding it (owned by the job, so deleted
        with it) and a DDPJob whose pods run ``torchrun /scripts/<script> ARGS``. Returns the
        job's name."""
        from kubernetes.client.exceptions import ApiException

        source = read_script(script)
        options = options or ScriptOptions()
        suffix = "".join(secrets.choice(SUFFIX_ALPHABET) for _ in range(5))
        try:
            config_map, job = script_objects(str(script), source, options, self.namespace, suffix)
        except InvalidJob as error:
            raise DDPError(str(error)) from None
        name = job["metadata"]["name"]
        with self._calls():
            try:
                self._core.create_namespaced_config_map(
                    self.namespace,
                    self._models.V1ConfigMap.model_validate(config_map),
                    _request_timeout=REQUEST_TIMEOUT,
                )
            except ApiException as error:
                if error.status == 409:
                    raise DDPError(
                        f'configmap "{name}" already exists in namespace "{self.namespace}":'
                        " choose another --name"
                    ) from None
                raise
        try:
            with self._calls():
                created = self._custom.create_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, job, _request_timeout=REQUEST_TIMEOUT
                )
        except DDPError:
            with self._calls():
                self._core.delete_namespaced_config_map(
                    name, self.namespace, _request_timeout=REQUEST_TIMEOUT
                )
            raise
        owner = owner_reference(cast(dict[str, Any], created)["metadata"], controller=False)
        patch = {"metadata": {"ownerReferences": [owner]}}
        with self._calls():
            self._core.patch_namespaced_config_map(
                name, self.namespace, patch, _request_timeout=REQUEST_TIMEOUT
            )
        return name

    def wait(
        self,
        name: str,
        timeout_s: float | None = None,
        *,
        on_status: Callable[[DDPJobStatus], None] | None = None,
        poll_s: float = 1.0,
    ) -> DDPJobStatus:
        """Polls the job until it Succeeded or Failed and returns its last status, calling
        ``on_status`` with every status seen. WaitTimeout after ``timeout_s`` (None: no limit);
        an API server that does not answer is ridden out for a minute."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        unreachable_since: float | None = None
        status = self.status(name)  # a cluster that never answered is an error at once
        while True:
            try:
                status = self.status(name)
                unreachable_since = None
            except ClusterUnreachable:
                now = time.monotonic()
                unreachable_since = unreachable_since or now
                if now - unreachable_since > API_PATIENCE_S:
                    raise
                time.sleep(poll_s)
                continue
            if on_status is not None:
                on_status(status)
            if status.phase in TERMINAL_PHASES:
                return status
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"ddpjob {name} is still {status.phase or 'without a phase'} after"
                    f" {timeout_s:.0f}s"
                )
            time.sleep(poll_s)

    # -- logs --------------------------------------------------------------------------------
    def _workers(self, name: str) -> list[dict[str, Any]]:
        """The job's node pods, by node index."""
        with self._calls():
            pods = self._core.list_namespaced_pod(
                self.namespace, label_selector=selector(name), _request_timeout=REQUEST_TIMEOUT
            )
        items = self._api.sanitize_for_serialization(pods).get("items") or []
        return sorted(items, key=lambda p: (_node_index(p) is None, _node_index(p) or 0))

    def _pod_log(self, pod: Mapping[str, Any], container: str, timestamps: bool) -> str:
        """A container's whole log; "" when it has not started yet."""
        meta = pod["metadata"]
        try:
            with self._calls():
                return str(
                    self._core.read_namespaced_pod_log(
                        meta["name"],
                        meta.get("namespace", self.namespace),
                        container=container,
                        timestamps=timestamps,
                        _request_timeout=REQUEST_TIMEOUT,
                    )
                )
        except ClusterUnreachable:
            raise
        except DDPError as error:
            if not _started(pod, container):
                return ""
            raise DDPError(f"cannot read the log of pod {meta['name']}: {error}") from None

    def logs(
        self, name: str, *, follow: bool = False, rank: int | None = None
    ) -> Iterator[LogLine]:
        """The lines of every node's log in time order, each knowing its node and global rank
        (:meth:`LogLine.show` prints ``[node-0 rank1] text``); only rank ``rank``'s when given.
        ``follow`` streams until the job has finished and its pods' logs have ended."""
        self.get(name)  # JobNotFound before anything else
        if follow:
            yield from self._follow(name, rank)
            return
        logs = [
            parse_pod_log(self._pod_log(p, CONTAINER, True), p["metadata"]["name"], _node_index(p))
            for p in self._workers(name)
        ]
        yield from pick_rank(merge_logs(logs), rank)

    def _follow(self, name: str, rank: int | None) -> Iterator[LogLine]:
        lines: queue.Queue[LogLine | None] = queue.Queue()
        merge = LiveMerge(FOLLOW_HOLD_S)
        streams: dict[str, _Stream] = {}  # by pod uid: a recreated pod is a new stream
        next_list = 0.0
        finished = False
        try:
            while True:
                now = time.monotonic()
                if now >= next_list:
                    next_list = now + POD_LIST_INTERVAL_S
                    finished = self.status(name).phase in TERMINAL_PHASES
                    for pod in self._workers(name):
                        uid = pod["metadata"]["uid"]
                        stream = streams.get(uid)
                        if _started(pod, CONTAINER) and (stream is None or stream.resumable(pod)):
                            streams[uid] = _Stream(self, pod, lines, after=stream)
                refused = next((s.error for s in streams.values() if s.error), None)
                if refused:
                    raise DDPError(refused)
                try:
                    line = lines.get(timeout=0.2)
                    if line is not None:
                        merge.add(line, time.monotonic())
                except queue.Empty:
                    pass
                yield from pick_rank(merge.ready(time.monotonic()), rank)
                if finished and all(s.done.is_set() for s in streams.values()) and lines.empty():
                    yield from pick_rank(merge.flush(), rank)
                    return
        finally:
            for stream in streams.values():
                stream.close()

    # -- metrics -----------------------------------------------------------------------------
    def metrics(
        self, name: str, *, image: str | None = None, timeout_s: float = 180.0
    ) -> list[dict[str, Any]]:
        """The lines of the job's metrics.jsonl, read from its checkpoint volume by a
        short-lived pod (see :func:`~ddp_operator.client_objects.metrics_reader_pod`) through
        its log, so that it works on any cluster. ``image`` overrides the job's image."""
        job = self.get(name)
        try:
            manifest = metrics_reader_pod(job, image or reader_image(job, self._workers(name)))
        except InvalidJob as error:
            raise NoMetrics(str(error)) from None
        with self._calls():
            created = self._core.create_namespaced_pod(
                self.namespace,
                self._models.V1Pod.model_validate(manifest),
                _request_timeout=REQUEST_TIMEOUT,
            )
        pod_name = str(self._api.sanitize_for_serialization(created)["metadata"]["name"])
        try:
            pod = self._pod_finished(pod_name, timeout_s)
            text = self._pod_log(pod, manifest["spec"]["containers"][0]["name"], False)
            if pod["status"]["phase"] != "Succeeded":
                said = text.strip().splitlines()[-1:] or ["no output"]
                raise NoMetrics(f"cannot read ddpjob {name}'s metrics.jsonl: {said[0]}")
            return parse_run_log(text)
        finally:
            self._delete_pod(pod_name)

    def _pod_finished(self, pod_name: str, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            with self._calls():
                pod = self._api.sanitize_for_serialization(
                    self._core.read_namespaced_pod(
                        pod_name, self.namespace, _request_timeout=REQUEST_TIMEOUT
                    )
                )
            if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
                return dict(pod)
            if time.monotonic() >= deadline:
                raise NoMetrics(
                    f"pod {pod_name}, which reads metrics.jsonl, did not finish within"
                    f" {timeout_s:.0f}s: {_pod_trouble(pod)}"
                )
            time.sleep(0.5)

    def _delete_pod(self, pod_name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        # Owned by the job: should this fail, the garbage collector deletes it with the job.
        with suppress(ApiException):
            self._core.delete_namespaced_pod(
                pod_name, self.namespace, grace_period_seconds=0, _request_timeout=REQUEST_TIMEOUT
            )

    def plot(
        self,
        name: str,
        path: str | Path,
        *,
        image: str | None = None,
        timeout_s: float = 180.0,
    ) -> Plot:
        """Draws the job's loss and learning rate by step (from metrics.jsonl) to ``path``."""
        found = curves(self.metrics(name, image=image, timeout_s=timeout_s))
        if found.empty:
            raise NoMetrics(f"ddpjob {name}'s metrics.jsonl has no step lines yet")
        return draw_curves(found, path, title=f"DDPJob {name}")


@dataclass
class _Stream:
    """One pod's log, followed by a thread that puts its lines on ``lines``."""

    client: DDPClient
    pod: Mapping[str, Any]
    lines: queue.Queue[LogLine | None]
    after: _Stream | None = None  # a stream of the same pod that broke off: skip what it had

    def __post_init__(self) -> None:
        self.done = threading.Event()
        self.error: str | None = None  # what the API said when it refused the log
        # The time of the last line put on ``lines``: final once ``done`` is set. A stream that
        # follows one that broke off skips the lines that one had (it gets the whole log again).
        self.last_at: int = self.after.last_at if self.after else -1
        self._skip_to = self.last_at
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def resumable(self, pod: Mapping[str, Any]) -> bool:
        """The stream broke off while the container still runs."""
        return self.done.is_set() and self.error is None and not _terminated(pod, CONTAINER)

    def _put(self, raw: bytes, before: LogLine | None) -> LogLine:
        meta = self.pod["metadata"]
        line = parse_line(raw.decode(errors="replace"), meta["name"], _node_index(self.pod), before)
        if line.at > self._skip_to:
            self.lines.put(line)
            self.last_at = max(self.last_at, line.at)
        return line

    def _run(self) -> None:
        from kubernetes.client.exceptions import ApiException

        meta = self.pod["metadata"]
        try:
            self._response = self.client._core.read_namespaced_pod_log(
                meta["name"],
                meta.get("namespace", self.client.namespace),
                container=CONTAINER,
                follow=True,
                timestamps=True,
                _preload_content=False,
            )
            before: LogLine | None = None
            pending = b""
            for chunk in self._response.stream(amt=None, decode_content=False):
                pending += chunk
                *complete, pending = pending.split(b"\n")
                for raw in complete:
                    before = self._put(raw, before)
            if pending:
                self._put(pending, before)
        except ApiException as error:
            self.error = (
                f"cannot read the log of pod {meta['name']}: {self.client._api_error(error, None)}"
            )
        except Exception:
            pass  # a stream that broke off is followed again while its pod runs
        finally:
            self.done.set()
            self.lines.put(None)  # wakes the reader

    def close(self) -> None:
        if self._response is not None:
            with suppress(Exception):
                self._response.close()


def _node_index(pod: Mapping[str, Any]) -> int | None:
    value = ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_INDEX)
    return int(value) if value is not None and str(value).isdigit() else None


def _container_state(pod: Mapping[str, Any], container: str) -> Mapping[str, Any]:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            return dict(status.get("state") or {})
    return {}


def _started(pod: Mapping[str, Any], container: str) -> bool:
    state = _container_state(pod, container)
    return "running" in state or "terminated" in state


def _terminated(pod: Mapping[str, Any], container: str) -> bool:
    return "terminated" in _container_state(pod, container) or (
        (pod.get("status") or {}).get("phase") in TERMINAL_PHASES
    )


def _pod_trouble(pod: Mapping[str, Any]) -> str:
    """Why a pod has not finished, as a pod's status says it."""
    status = pod.get("status") or {}
    for c in status.get("containerStatuses") or []:
        waiting = (c.get("state") or {}).get("waiting")
        if waiting:
            return f"{waiting.get('reason')}: {waiting.get('message') or ''}".strip(": ")
    for cond in status.get("conditions") or []:
        if cond.get("status") == "False" and cond.get("message"):
            return f"{cond.get('reason')}: {cond['message']}"
    return f"phase {status.get('phase', 'unknown')}"


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


def draw_curves(found: Curves, path: str | Path, title: str = "") -> Plot:
    """The loss (above) and the learning rate (below) by optimizer step, as a PNG (or what
    ``path``'s suffix names); a curve without points is left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        (label, points)
        for label, points in (("training loss", found.loss), ("learning rate", found.lr))
        if points
    ]
    if not panels:
        raise ValueError("no curve has points to draw")
    fig, axes = plt.subplots(len(panels), 1, sharex=True, figsize=(7, 2.4 * len(panels) + 0.6))
    axes_list = list(axes) if len(panels) > 1 else [axes]
    for ax, (label, points) in zip(axes_list, panels, strict=True):
        ax.plot([s for s, _ in points], [v for _, v in points])
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes_list[-1].set_xlabel("optimizer step")
    if title:
        axes_list[0].set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    lines = sum(len(ax.get_lines()) for ax in axes_list)
    plt.close(fig)
    return Plot(path=Path(path), curves=found, lines=lines)
