"""A tiny JSON client of the Kubernetes API for the test kubelet: requests and informers
(list, then watch from the list's resourceVersion, relist on expiry), plain dicts only."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import ssl
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger("ddp_devcluster.kubelet")


class ApiError(RuntimeError):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status


class Api:
    def __init__(self, kubeconfig: Path) -> None:
        cfg = yaml.safe_load(kubeconfig.read_text())
        ctx_name = cfg["current-context"]
        ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])
        self.server = cluster["server"].rstrip("/")
        self.ca_pem = base64.b64decode(cluster["certificate-authority-data"])
        self.ssl = ssl.create_default_context(cadata=self.ca_pem.decode())
        self.token = user.get("token", "")
        if "client-certificate-data" in user:
            with tempfile.TemporaryDirectory() as d:
                crt, key = Path(d) / "c.crt", Path(d) / "c.key"
                crt.write_bytes(base64.b64decode(user["client-certificate-data"]))
                key.write_bytes(base64.b64decode(user["client-key-data"]))
                self.ssl.load_cert_chain(str(crt), str(key))

    def _open(self, method: str, path: str, body: Any, content_type: str, timeout: float) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.server}{path}", data=data, method=method)
        req.add_header("Content-Type", content_type)
        req.add_header("Accept", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            return urllib.request.urlopen(req, context=self.ssl, timeout=timeout)
        except urllib.error.HTTPError as e:
            raise ApiError(e.code, e.read().decode(errors="replace")) from None

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float = 30,
    ) -> Any:
        with self._open(method, path, body, content_type, timeout) as r:
            return json.loads(r.read() or b"null")

    def get(self, path: str) -> Any | None:
        """The object, or None when it does not exist."""
        try:
            return self.request("GET", path)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def merge_patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body, "application/merge-patch+json")

    def watch(self, path: str, resource_version: str, timeout_s: int = 60) -> Any:
        sep = "&" if "?" in path else "?"
        q = urllib.parse.urlencode(
            {
                "watch": "1",
                "resourceVersion": resource_version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": str(timeout_s),
            }
        )
        return self._open("GET", f"{path}{sep}{q}", None, "application/json", timeout_s + 30)


class Informer:
    """Keeps ``objects`` (uid -> object) in step with the API for one list path; calls
    ``on_change`` after each change. ``synced`` is set after the first full list."""

    def __init__(self, api: Api, path: str, on_change: Callable[[], None]) -> None:
        self.api, self.path, self.on_change = api, path, on_change
        self.objects: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.synced = threading.Event()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"informer {path}", daemon=True)

    def start(self) -> Informer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()

    def snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.objects.values())

    def _run(self) -> None:
        while not self.stopped.is_set():
            try:
                rv = self._list()
                while not self.stopped.is_set():
                    rv = self._watch(rv)
            except Exception as e:  # relist after any trouble, as client-go does
                if not self.stopped.is_set():
                    log.debug("informer %s: %s; relisting", self.path, e)
                    time.sleep(0.5)

    def _list(self) -> str:
        out = self.api.request("GET", self.path)
        with self.lock:
            self.objects = {o["metadata"]["uid"]: o for o in out.get("items") or []}
        self.synced.set()
        self.on_change()
        return str(out["metadata"]["resourceVersion"])

    def _watch(self, rv: str) -> str:
        with self.api.watch(self.path, rv) as stream:
            for line in stream:
                if self.stopped.is_set():
                    break
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    raise ApiError(int(obj.get("code", 500)), str(obj.get("message")))
                rv = obj["metadata"].get("resourceVersion", rv)
                if kind == "BOOKMARK":
                    continue
                with self.lock:
                    if kind == "DELETED":
                        self.objects.pop(obj["metadata"]["uid"], None)
                    else:
                        self.objects[obj["metadata"]["uid"]] = obj
                with contextlib.suppress(Exception):
                    self.on_change()
        return rv
