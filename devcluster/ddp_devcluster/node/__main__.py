"""``python -m ddp_devcluster.node [--helper-image REF] [IMAGE...]``: a control plane and one
real node with these podman images loaded, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading

from ..plane import ControlPlane
from . import RealNode


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddp_devcluster.node", description=__doc__)
    ap.add_argument("images", nargs="*", help="podman image refs to import into containerd")
    ap.add_argument("--helper-image", help="local-path-provisioner's helper pods' image")
    args = ap.parse_args(argv)
    node = RealNode(images=args.images)
    if args.helper_image:
        node.helper_image = args.helper_image
    lay = node.prepare()
    plane = ControlPlane(nodes=0, advertise_address=lay.host_ip, keep_workdir=True)
    try:
        plane.start()
        node.start(plane)
        print(f"export KUBECONFIG={plane.kubeconfig}", flush=True)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()
    finally:
        node.stop()
        plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
