"""A dedicated c10d rendezvous store: a long-lived TCPStore server that no trainer hosts.

Run it as ``python -m ddp_trainer.rdzv_store`` (port :data:`~ddp_api.contract.RDZV_PORT`,
in its own small pod behind its own Service) and start every torchrun agent with
``--rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-conf is_host=false,...``: any trainer
agent can then die without taking the rendezvous down with it.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import uuid
from collections.abc import Sequence
from typing import Any

from ddp_api.contract import RDZV_PORT

log = logging.getLogger("ddp_trainer.rdzv_store")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ddp_trainer.rdzv_store",
        description="Serve a c10d TCPStore for torchrun's c10d rendezvous (agents use "
        "--rdzv-conf is_host=false).",
    )
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
    parser.add_argument("--port", type=int, default=RDZV_PORT, help="port to listen on")
    parser.add_argument(
        "--timeout-s", type=int, default=300, help="timeout of store operations in seconds"
    )
    return parser


def serve(host: str, port: int, timeout_s: int, stop: threading.Event) -> int:
    """Serve until `stop` is set; returns the exit code."""
    from ddp_trainer.launch.store_probe import STORE_ID_KEY, open_store

    store = open_store(host, port, timeout_s, serve=True)
    # A new id per start: a node's agent that finds another id knows the store it joined is
    # gone (ddp_trainer.node starts torchrun again instead of failing the pod).
    store_id = uuid.uuid4().hex
    store.set(STORE_ID_KEY, store_id)
    log.info("rendezvous store listening on %s:%d (id %s)", host, store.port, store_id)
    stop.wait()
    log.info("rendezvous store stopping")
    del store
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return serve(args.host, args.port, args.timeout_s, stop)


if __name__ == "__main__":
    sys.exit(main())
