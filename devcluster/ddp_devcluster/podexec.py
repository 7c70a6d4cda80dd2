"""Start one container of the test kubelet: ``python -m ddp_devcluster.podexec SPEC.json``.

Development and tests only. Its first process writes the container's output (stdout and
stderr through one pipe) to the log, its own stdout, and the time of every line to the
``log_times`` file (see podlogs.py); a child does the rest, and the first process exits as
that child did once the output has ended.

As root (``isolate``) the child enters the pod's network namespace, takes private mount, UTS
and PID namespaces, bind-mounts the pod's volumes, /etc/hosts and /etc/resolv.conf, sets the
hostname, and forks an init (PID 1 of the pod's PID namespace) that runs the container
command as PID 2, forwards signals to it and reaps orphans. When the command exits, init
exits with its code (128+N for signal N) and the kernel kills what is left in the namespace.
Every stage dies with its parent (``PR_SET_PDEATHSIG``), so a killed kubelet takes its pods'
processes with it, grandchildren included.

Without ``isolate`` (no root), it only starts the command in its own session and forwards
signals; nothing is mounted.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from . import podlogs

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x4000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
# How long output may still come after the container exited: without a PID namespace, the
# orphans it left can hold the pipe open for good.
DRAIN_S = 1.0
FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)

_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int) -> None:
    rc = _libc.mount(
        None if source is None else source.encode(),
        target.encode(),
        None if fstype is None else fstype.encode(),
        ctypes.c_ulong(flags),
        None,
    )
    _check(rc, f"mount {source} on {target}")


def _die_with_parent(parent: int | None) -> None:
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # Did the parent die before prctl took effect? (PID 1 of a new PID namespace cannot
    # tell: its parent lives outside, getppid() is 0 either way.)
    if parent is not None and os.getppid() != parent:
        os._exit(137)


def exit_code(status: int) -> int:
    """A wait status as a container exit code (128+N for signal N, like a shell)."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _forward_to(pid: int) -> None:
    def handler(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for s in FORWARDED:
        signal.signal(s, handler)


def _exec(spec: dict[str, Any]) -> None:
    """In the child that becomes the container: never returns."""
    try:
        os.setsid()
        for s in (*FORWARDED, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(s, signal.SIG_DFL)
        os.chdir(spec.get("cwd") or "/")
        argv = spec["argv"]
        os.execvpe(argv[0], argv, spec["env"])
    except BaseException as e:
        print(f"test kubelet: cannot start {spec['argv'][:1]}: {e}", file=sys.stderr, flush=True)
        os._exit(127)


def _record(made: Path | None, path: str) -> None:
    if made is None:
        return
    st = os.lstat(path)
    fd = os.open(made, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{st.st_dev} {st.st_ino} {path}\n".encode())
    finally:
        os.close(fd)


def _mount_point(target: str, is_dir: bool, made: Path | None) -> None:
    """Create a missing mount point, recording what was created so it can be removed."""
    missing = []
    p = Path(target)
    while not p.exists() and not p.is_symlink():
        missing.append(p)
        p = p.parent
    for i, q in enumerate(reversed(missing)):
        last = i == len(missing) - 1
        if last and not is_dir:
            q.touch()
        else:
            q.mkdir()
        _record(made, str(q))


def _setup_namespaces(spec: dict[str, Any]) -> None:
    if spec.get("netns"):
        fd = os.open(spec["netns"], os.O_RDONLY)
        _check(_libc.setns(fd, CLONE_NEWNET), "setns")
        os.close(fd)
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWPID), "unshare")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    socket.sethostname(spec["hostname"])
    if spec.get("netns"):
        # /sys shows the network devices of the namespace that mounted it, as `ip netns exec`
        with contextlib.suppress(OSError):
            _check(_libc.umount2(b"/sys", MNT_DETACH), "umount /sys")
            _mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    made = Path(spec["mountpoints_file"]) if spec.get("mountpoints_file") else None
    for m in spec.get("mounts", []):
        source, target = m["source"], m["target"]
        _mount_point(target, os.path.isdir(source), made)
        _mount(source, target, None, MS_BIND | MS_REC)
        if m.get("readonly"):
            _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY)


def _init(spec: dict[str, Any]) -> None:
    """PID 1 of the pod's PID namespace: run the command, forward signals, reap."""
    _die_with_parent(None)
    with contextlib.suppress(OSError):
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    main = os.fork()
    if main == 0:
        _exec(spec)
    _forward_to(main)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(0)
        if pid == main:
            os._exit(exit_code(status))


def _exit_as(status: int) -> None:
    """Exit with a child's wait status: the same code, or killed by the same signal, so the
    kubelet sees what a container runtime would report."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(exit_code(status))


def _supervise(child: int) -> None:
    _forward_to(child)
    while True:
        pid, status = os.waitpid(child, 0)
        if pid == child:
            _exit_as(status)


def _log_output(spec: dict[str, Any], me: int) -> None:
    """Runs the container in a child with a pipe for stdout and stderr, writes what comes
    through it to the log with the time of every line, and exits as the child did."""
    times_fd = os.open(spec["log_times"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        _die_with_parent(me)
        os.close(r)
        os.close(times_fd)
        os.dup2(w, 1)
        os.dup2(w, 2)
        os.close(w)
        _run(spec)
    os.close(w)
    _forward_to(child)
    writer = podlogs.LogWriter(1, times_fd)
    status: int | None = None
    exited = 0.0
    while True:
        if select.select([r], [], [], 0.2)[0]:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            writer.write(chunk, time.time_ns())
        if status is None:
            pid, st = os.waitpid(child, os.WNOHANG)
            if pid == child:
                status, exited = st, time.monotonic()
        elif time.monotonic() - exited > DRAIN_S:
            break
    writer.finish(time.time_ns())
    if status is None:
        _, status = os.waitpid(child, 0)
    _exit_as(status)


def _run(spec: dict[str, Any]) -> None:
    """Sets up the sandbox and runs the container in it; exits as the container does."""
    if not spec.get("isolate"):
        me = os.getpid()
        child = os.fork()
        if child == 0:
            _die_with_parent(me)
            _exec(spec)
        _supervise(child)
    try:
        _setup_namespaces(spec)
    except OSError as e:
        print(f"test kubelet: cannot set up the pod sandbox: {e}", file=sys.stderr, flush=True)
        os._exit(128)
    init = os.fork()  # PID 1 of the new PID namespace
    if init == 0:
        _init(spec)
    _supervise(init)


def main(argv: list[str]) -> None:
    spec = json.loads(Path(argv[0]).read_text())
    _die_with_parent(int(spec["parent_pid"]))
    if spec.get("log_times"):
        _log_output(spec, os.getpid())
    _run(spec)


if __name__ == "__main__":
    main(sys.argv[1:])
