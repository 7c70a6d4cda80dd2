"""Whether the job's rendezvous store is there, and which one: every store publishes a random id
under :data:`STORE_ID_KEY` when it starts (:mod:`ddp_api.rdzv_store`), so a node
that finds another id, or none, knows the store it joined is gone (the supervisor,
:mod:`ddp_trainer.launch.supervisor`, then starts torchrun again)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from ddp_api.contract import RDZV_PORT
from ddp_api.rdzv_store import STORE_ID_KEY

if TYPE_CHECKING:
    from torch.distributed import TCPStore

T = TypeVar("T")

log = logging.getLogger("ddp_trainer.node")

PROBE_TIMEOUT_S = 1.0  # one try at the store: short, so none sleeps past a new store
STORE_POLL_S = 0.25


def store_replaced(joined: str | None, now: str | None) -> bool:
    """Whether the store torchrun joined is gone for sure: another store answers at its
    address (a store that does not answer may only be slow, or its machine not yet declared
    lost: torchrun's own timeouts judge that)."""
    return joined is not None and now is not None and now != joined


def split_endpoint(endpoint: str, default_port: int = RDZV_PORT) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    if not host:
        return endpoint, default_port
    return host.strip("[]"), int(port)


def worker_store_endpoint(environ: Mapping[str, str]) -> tuple[str, int] | None:
    """Where a torchrun worker's store is (``MASTER_ADDR:MASTER_PORT``, the store of its
    process group, which the agents host on rank 0's node); None outside torchrun."""
    host, port = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT", "")
    if not host or not port.isdigit():
        return None
    return host, int(port)


def open_store(host: str, port: int, timeout_s: float, *, serve: bool) -> TCPStore:
    """The job's rendezvous store: a client of it, or (``serve``) a server as the store pod's
    (:mod:`ddp_api.rdzv_store`). Neither waits for workers (torchrun's agents come and go); a store
    operation gives up after ``timeout_s``."""
    from torch.distributed import TCPStore

    return TCPStore(
        host,
        port,
        is_master=serve,
        wait_for_workers=False,
        timeout=timedelta(seconds=timeout_s),
    )


def read_store_id(endpoint: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """The id the store at ``endpoint`` published, or None when none answers in time.

    A plain TCP connect first: TCPStore's client backs off for seconds after a refused
    connection, longer than ``timeout_s``, which would start torchrun seconds after the new
    store answers."""
    host, port = split_endpoint(endpoint)
    try:
        socket.create_connection((host, port), timeout=min(timeout_s, 1.0)).close()
    except OSError:
        return None
    try:
        return open_store(host, port, timeout_s, serve=False).get(STORE_ID_KEY).decode()
    except Exception:  # refused, unresolvable, timed out: no store there now
        return None


def bounded(call: Callable[[], T], wait_s: float) -> T:
    """``call()`` in a daemon thread: its result, its error, or TimeoutError after ``wait_s``.
    A store whose machine froze still accepts connections (its kernel answers) while its
    process never replies, and TCPStore's client can then block past its timeout (it bounds
    only its waits for keys): the thread is left behind, blocked on that dead connection."""
    box: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            box.append(call())
        except BaseException as error:
            failed.append(error)

    thread = threading.Thread(target=run, name="store-call", daemon=True)
    thread.start()
    thread.join(wait_s)
    if failed:
        raise failed[0]
    if not box:
        raise TimeoutError(f"no answer in {wait_s:g}s")
    return box[0]


def probe_store_id(endpoint: str, wait_s: float = 2 * PROBE_TIMEOUT_S) -> str | None:
    """:func:`read_store_id` that returns within ``wait_s`` whatever happens (:func:`bounded`);
    None when it takes too long: no store answers."""
    try:
        return bounded(lambda: read_store_id(endpoint), wait_s)
    except TimeoutError:
        return None


def wait_for_store(endpoint: str, deadline_s: float, stopping: Any) -> str | None:
    """Polls until the store answers with its id (None past the deadline or when stopping)."""
    started = time.monotonic()
    said = 0.0
    while not stopping():
        found = probe_store_id(endpoint)
        if found is not None:
            return found
        waited = time.monotonic() - started
        if waited >= deadline_s:
            return None
        if waited - said >= 10:
            said = waited
            log.info("waiting for the rendezvous store at %s (%.0fs)", endpoint, waited)
        time.sleep(STORE_POLL_S)
    return None
