"""Leaving nothing behind: what a node instance made is recorded, and removed even after SIGKILL.

An instance registers itself in :func:`registry` before it makes anything, and a watchdog
(``python -m ddp_devcluster.node.cleanup --watch PID FILE``, in a session of its own) removes
everything once the process that started the node is gone, however it ended. A normal stop
runs the same :func:`remove` first. Removal is idempotent and order matters: processes (found
by the marker in their environment, and every process in the node's cgroups), then the network
namespace (its bridge, veths, iptables rules and the host's end of the link go with it), then
the cgroups, then the state folder.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..plane import processes_with_marker

CGROUP_ROOT = Path("/sys/fs/cgroup")


def registry() -> Path:
    return Path("/run/ddp-node")


def record(entry: dict[str, object]) -> Path:
    registry().mkdir(parents=True, exist_ok=True)
    path = registry() / f"{entry['x']}.json"
    path.write_text(json.dumps(entry))
    return path


def entries() -> list[dict[str, object]]:
    if not registry().is_dir():
        return []
    found = []
    for path in sorted(registry().glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            found.append(json.loads(path.read_text()))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def cgroup_dirs(relative: str) -> list[Path]:
    """The node's cgroup folder in every hierarchy mounted under /sys/fs/cgroup."""
    rel = relative.strip("/")
    return [h / rel for h in sorted(CGROUP_ROOT.iterdir()) if (h / rel).is_dir()]


def cgroup_pids(relative: str) -> set[int]:
    pids: set[int] = set()
    for top in cgroup_dirs(relative):
        for procs in top.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(p) for p in procs.read_text().split())
    return pids


def processes_naming(folder: str) -> set[int]:
    """Processes whose command line names ``folder``: containerd's shims, which containerd
    starts outside its own process group and which outlive it by design."""
    needle = folder.encode()
    pids = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if needle in cmdline.read_bytes():
                pids.add(int(cmdline.parent.name))
    return pids


def _kill_all(marker: str, cgroup: str, state: str) -> None:
    freezer = CGROUP_ROOT / "freezer" / cgroup.strip("/")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        victims = set(processes_with_marker(marker)) | cgroup_pids(cgroup)
        victims |= processes_naming(state.rstrip("/") + "/")
        victims.discard(os.getpid())
        if not victims:
            return
        # Frozen first, so that nothing in the pods forks while it is being killed.
        with contextlib.suppress(OSError):
            (freezer / "freezer.state").write_text("FROZEN")
        for pid in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            (freezer / "freezer.state").write_text("THAWED")
        time.sleep(0.2)
    raise RuntimeError(f"processes of node {cgroup} survive SIGKILL: {sorted(victims)}")


def _remove_cgroups(cgroup: str) -> None:
    for top in cgroup_dirs(cgroup):
        # Deepest first: a cgroup folder is removed with rmdir once it has no children.
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                d.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def remove(entry: dict[str, object]) -> None:
    """Remove one instance's processes, network namespace, cgroups and files."""
    _kill_all(str(entry["marker"]), str(entry["cgroup"]), str(entry["state"]))
    subprocess.run(["ip", "netns", "delete", str(entry["netns"])], capture_output=True, check=False)
    subprocess.run(
        ["ip", "link", "delete", str(entry["host_link"])], capture_output=True, check=False
    )
    _remove_cgroups(str(entry["cgroup"]))
    state = Path(str(entry["state"]))
    if state.is_dir():
        shutil.rmtree(state, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        (registry() / f"{entry['x']}.json").unlink()


def remove_orphans() -> list[int]:
    """Remove instances whose owner is gone (a SIGKILL before the watchdog finished)."""
    removed = []
    for entry in entries():
        if not alive(int(str(entry["owner"]))):
            remove(entry)
            removed.append(int(str(entry["x"])))
    return removed


def spawn_watchdog(owner: int, entry_file: Path) -> subprocess.Popen[bytes]:
    """A process in its own session that removes the instance once ``owner`` is gone."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ddp_devcluster.node.cleanup",
            "--watch",
            str(owner),
            str(entry_file),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("DDP_DEVCLUSTER_ID")},
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddp_devcluster.node.cleanup")
    ap.add_argument("--watch", nargs=2, metavar=("PID", "ENTRY"))
    ap.add_argument("--orphans", action="store_true", help="remove instances with no owner")
    args = ap.parse_args(argv)
    if args.watch:
        owner, entry_file = int(args.watch[0]), Path(args.watch[1])
        while alive(owner) and entry_file.exists():
            time.sleep(0.5)
        if entry_file.exists():
            remove(json.loads(entry_file.read_text()))
    if args.orphans:
        print(json.dumps({"removed": remove_orphans()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
