"""A job's c10d rendezvous store: a TCPStore server that no trainer hosts, in a small pod of its
own behind its own Service, so any torchrun agent can die without taking the rendezvous down.

The store pod runs the job's own image (the trainer image, or the user's ``spec.image``) with
this file's text as its program (:func:`program`). It therefore imports nothing but the
standard library and torch, which every image that runs torchrun has; and it serves with the
torch of the job's own agents.

Each start publishes a new random id under :data:`STORE_ID_KEY`: a node wrapper that finds
another id, or none, knows the store it joined is gone and starts torchrun again
(``ddp_trainer.launch.store_probe``).
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import sys
import threading
import uuid
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

STORE_ID_KEY = "ddp.dev/store-id"
STOP_POLL_S = 0.1  # how often the main thread looks whether SIGTERM came (see serve)

log = logging.getLogger("ddp_store")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rdzv_store",
        description="Serve a c10d TCPStore for torchrun's c10d rendezvous (agents use "
        "--rdzv-conf is_host=false).",
    )
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
    parser.add_argument("--port", type=int, default=29400, help="port to listen on")
    parser.add_argument(
        "--timeout-s", type=int, default=300, help="timeout of store operations in seconds"
    )
    return parser


def serve(host: str, port: int, timeout_s: int, stop: threading.Event) -> NoReturn:
    """Serve until ``stop`` is set, then end the process at once (exit code 0)."""
    from torch.distributed import TCPStore

    # wait_for_workers=False: torchrun's agents come and go; none is awaited.
    store = TCPStore(
        host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s)
    )
    store_id = uuid.uuid4().hex
    store.set(STORE_ID_KEY, store_id)
    log.info("rendezvous store listening on %s:%d (id %s)", host, store.port, store_id)
    # In slices, not one wait: a SIGTERM taken by one of the TCPStore's threads trips Python's
    # flag but does not wake a main thread asleep in a lock; between slices the handler runs.
    while not stop.wait(STOP_POLL_S):
        pass
    log.info("rendezvous store stopping")
    # Out at once, listening to the end: closing the store first and then tearing torch down
    # (0.7 s) left a moment in which the kubelet's readiness probe was refused (a Warning
    # event for nearly every store stopped), and Python's teardown can abort while a TCPStore
    # thread runs (as it did the node supervisor's). A store's state is never kept.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)  # PID 1 in its pod: no default action
    signal.signal(signal.SIGINT, on_signal)
    serve(args.host, args.port, args.timeout_s, stop)


@functools.cache
def program() -> str:
    """This file's text: the store pod runs ``python3 -c <it> --host ... --port ...`` (images
    with torch have ``python3``, not all have ``python``)."""
    return Path(__file__).read_text()


if __name__ == "__main__":
    main()
