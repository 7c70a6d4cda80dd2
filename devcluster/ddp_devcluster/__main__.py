"""ddp-devcluster: the embedded control plane from the command line.

build                 build the pinned binaries into the cache (once per version)
images [operator|trainer] [--save-dir D]
                      build both images with buildah from local stand-in bases (images.py)
up [--nodes N]        start the plane in the background; prints the KUBECONFIG to export
down                  stop the plane that `up` started, leaving no process behind
serve [--nodes N]     run the plane in the foreground until SIGTERM or Ctrl-C
kind-preload          the kind node image's first part (the trainer's dependency layers
                      unpacked by its containerd) and both images in the registry; then
                      what is left of `build --for kind` (`make up` runs it beside that)
kind-up               a kind cluster of 4 nodes (podman), the host registry it pulls from, both
                      images pushed there and the chart installed; prints the KUBECONFIG to
                      export (kind/cluster-4.yaml, docs/kind.md)
kind-down             delete that cluster, stop the registry, remove kind's podman network
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .paths import state_dir


def _serve(nodes: int, ready_file: Path | None) -> int:
    from .plane import ControlPlane

    stop = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    cp = ControlPlane(nodes=nodes)
    try:
        cp.start()
        info = {
            "pid": os.getpid(),
            "kubeconfig": str(cp.kubeconfig),
            "server": cp.server,
            "startup_s": round(cp.startup_s, 2),
            "marker": cp.marker,
        }
        if ready_file:
            ready_file.write_text(json.dumps(info))
        else:
            print(f"export KUBECONFIG={cp.kubeconfig}", flush=True)
        while not stop:
            dead = [p.name for p in cp.procs.values() if not p.alive()]
            if dead:
                print(f"{', '.join(dead)} exited; stopping the plane", file=sys.stderr)
                return 1
            time.sleep(0.5)
        return 0
    finally:
        cp.stop()


def _up(nodes: int) -> int:
    sd = state_dir()
    sd.mkdir(parents=True, exist_ok=True)
    ready = sd / "ready.json"
    if ready.exists():
        info = json.loads(ready.read_text())
        if _alive(info["pid"]):
            print(f"already running (pid {info['pid']})\nexport KUBECONFIG={info['kubeconfig']}")
            return 0
        ready.unlink()
    log = (sd / "serve.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ddp_devcluster",
            "serve",
            "--nodes",
            str(nodes),
            "--ready-file",
            str(ready),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # outlives this command; `down` stops it
    )
    t0 = time.monotonic()
    print(f"starting the control plane with {nodes} kwok nodes (log: {sd / 'serve.log'})")
    while not ready.exists():
        if proc.poll() is not None:
            print((sd / "serve.log").read_text()[-4000:], file=sys.stderr)
            return 1
        time.sleep(0.2)
    info = json.loads(ready.read_text())
    print(f"ready in {time.monotonic() - t0:.1f}s (pid {info['pid']}); to use it:")
    print(f"export KUBECONFIG={info['kubeconfig']}")
    return 0


def _down() -> int:
    ready = state_dir() / "ready.json"
    if not ready.exists():
        print("no control plane is running")
        return 0
    info = json.loads(ready.read_text())
    pid = int(info["pid"])
    if _alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)  # its children die with it (PDEATHSIG)
    ready.unlink(missing_ok=True)
    from .plane import processes_with_marker

    left = processes_with_marker(info["marker"])
    for p in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    print("stopped" + (f" (killed {len(left)} leftover processes)" if left else ""))
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="ddp-devcluster", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the pinned binaries into the cache")
    b.add_argument("--force", action="store_true")
    b.add_argument("--for", dest="what", default="all", help="all | kind (make up)")
    for name in ("up", "serve"):
        p = sub.add_parser(name)
        p.add_argument("--nodes", type=int, default=2, help="kwok nodes to create")
        if name == "serve":
            p.add_argument("--ready-file", type=Path, help=argparse.SUPPRESS)
    sub.add_parser("down")
    sub.add_parser("kind-preload")
    sub.add_parser("kind-up")
    sub.add_parser("kind-down")
    sub.add_parser("demo", help="run a real training job on this machine", add_help=False)
    sub.add_parser("images", help="build both images with buildah (images --help)", add_help=False)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["images"]:
        from .images import main as images_main

        return images_main(argv[1:])
    if argv[:1] == ["demo"]:
        from .demo import main as demo_main

        return demo_main(argv[1:])
    args = ap.parse_args(argv)
    if args.cmd == "build":
        from .build import main as build_main

        return build_main(["--force"] * args.force + ["--for", args.what])
    if args.cmd == "up":
        return _up(args.nodes)
    if args.cmd == "serve":
        return _serve(args.nodes, args.ready_file)
    if args.cmd == "kind-preload":
        return _kind_preload()
    if args.cmd in ("kind-up", "kind-down"):
        from .kind.lock import InUse

        try:
            return _kind_up() if args.cmd == "kind-up" else _kind_down()
        except InUse as e:
            print(f"{args.cmd}: {e}", file=sys.stderr)
            return 2
    return _down()


def _log(m: str) -> None:
    print(f">> {m}", flush=True)


def _kind_preload() -> int:
    """What of `make up` needs only the images, containerd, kind and the registry, beside
    `build --for kind` (make kind-ready): the node image's base and its preload of the
    trainer's dependency layers (nodeimage.ensure_preload), and both images pushed to the
    registry, which is left running for kind-up; then the kind cluster's binaries that the
    other side has not begun (build.ensure_all shares them)."""
    from . import images
    from .build import KIND_TOOLS, ensure_all
    from .kind import registry
    from .kind.nodeimage import ensure_preload

    ensure_all(only=("containerd", "kind", "registry"))
    _, folder = ensure_preload(_log)
    _log(f"the trainer's dependencies are unpacked in {folder}")
    registry.start()
    for ref in images.default_refs().values():  # built by `make images` just before
        registry.push(ref, _log)  # (kind-up builds and pushes again what changed since)
    ensure_all(only=KIND_TOOLS)
    return 0


def _kind_up() -> int:
    from .kind.cluster import NAME, install, up, user_tools
    from .kind.lock import held

    with held(NAME, "make up", _log):
        kubeconfig = up(log=_log)
        install(kubeconfig, log=_log)
    print("# kubectl and `kubectl ddp` for this cluster, in your shell:")
    print(f"export KUBECONFIG={kubeconfig} PATH={user_tools()}:$PATH")
    return 0


def _kind_down() -> int:
    from .kind.cluster import down

    down(log=_log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
