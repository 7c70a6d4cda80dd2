"""DDPJobs themselves: read one, create one from an object or a script, wait for its end."""

from __future__ import annotations

import secrets
import string
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

from pydantic import ValidationError

from ddp_api.contract import API_VERSION, GROUP, KIND, PLURAL, VERSION
from ddp_api.ddpjob import TERMINAL_PHASES, DDPJob, DDPJobStatus, Progress
from ddp_api.metav1 import owner_reference
from ddp_api.trainer_config import validation_message

from .connection import REQUEST_TIMEOUT, Connection
from .errors import ApiError, ClusterUnreachable, DDPError, ScriptNotFound, WaitTimeout
from .objects import InvalidJob, ScriptOptions, script_objects

API_PATIENCE_S = 60.0  # how long `wait` rides out an unreachable API server
SUFFIX_ALPHABET = string.ascii_lowercase + string.digits


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


class Jobs(Connection):
    """Reads, creates and waits for the DDPJobs of the connection's namespace."""

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
        body.setdefault("apiVersion", API_VERSION)
        body.setdefault("kind", KIND)
        body.pop("status", None)
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
        with it) and a DDPJob whose pods run it, ``/scripts/<script> ARGS``, under the trainer
        image's node wrapper or plain torchrun (``options.launcher``). Returns the job's
        name."""
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
        an API server that does not answer, or answers as one restarting does
        (:attr:`ApiError.passing`), is ridden out for a minute."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        unreachable_since: float | None = None
        status = self.status(name)  # a cluster that never answered well is an error at once
        while True:
            try:
                status = self.status(name)
                unreachable_since = None
            except (ClusterUnreachable, ApiError) as error:
                if isinstance(error, ApiError) and not error.passing:
                    raise
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
