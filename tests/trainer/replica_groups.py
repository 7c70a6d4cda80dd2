"""PerStep mode on loopback: a real ``torchft_lighthouse``, replica groups started as the
operator's pods are (``ddp_trainer.node`` running torchrun standalone with the PerStep
environment), warm groups forked from a zygote for kill loops, and the sample logs they write.

Zygote: ``python replica_groups.py`` imports torch, torchft and the trainer once, then forks a
group on each command (a pod of one process: torchrun standalone's worker environment, its own
store, its own session, so a SIGKILL of its process group is the whole pod). A restart then
costs no interpreter start: starting ~50 fresh ones on two cores would take minutes.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import signal
import subprocess
import sys
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer_harness import HERE, Launcher, Proc, subprocess_env, trainer_settings, wait_until

from ddp_devcluster.procs import free_port
from ddp_trainer.launch.warm import preload, run_trainer

LIGHTHOUSE = Path(sys.executable).with_name("torchft_lighthouse")


def lighthouse(
    launcher: Launcher,
    heartbeat_ms: int,
    join_ms: int,
    port: int | None = None,
    min_groups: int = 1,
) -> tuple[Proc, str]:
    """A lighthouse on loopback that forms a quorum of ``min_groups`` or more groups; returns it
    and its URL. ``port``: the port of a lighthouse it replaces (its log is then
    lighthouse-<port>-<n>.log)."""
    log = launcher.workdir / "lighthouse.log"
    if port is not None:
        log = launcher.workdir / f"lighthouse-{port}-{len(launcher.procs)}.log"
    port = port or free_port()
    env = subprocess_env(RUST_LOG="info")
    with open(log, "wb") as out:
        popen = subprocess.Popen(
            [
                str(LIGHTHOUSE),
                f"--bind=127.0.0.1:{port}",
                f"--min_replicas={min_groups}",
                f"--heartbeat_timeout_ms={heartbeat_ms}",
                f"--join_timeout_ms={join_ms}",
                "--quorum_tick_ms=20",
            ],
            cwd=launcher.workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    proc = Proc("lighthouse", popen, log)
    launcher.procs.append(proc)
    wait_until(lambda: "listening" in proc.output(), 30, "the lighthouse to listen")
    return proc, f"http://127.0.0.1:{port}"


def group_env(
    group: int, lighthouse_url: str, *, groups: int, timeout_s: float, samples: Path
) -> dict[str, str]:
    """The PerStep environment the operator gives pod ``group`` (with the pod IP on loopback)."""
    return {
        "DDPJOB_FAULT_TOLERANCE": "PerStep",
        "TORCHFT_LIGHTHOUSE": lighthouse_url,
        "REPLICA_GROUP_ID": str(group),
        "NUM_REPLICA_GROUPS": str(groups),
        "DDPJOB_MIN_GROUPS": "1",
        "DDPJOB_GROUP_TIMEOUT_S": str(timeout_s),
        "DDPJOB_NAME": "job",
        "PET_RDZV_ID": "job-uid",
        "POD_NAME": f"job-node-{group}",
        "POD_IP": "127.0.0.1",
        "DDPJOB_SAMPLE_LOG": str(samples),
    }


def pod(
    launcher: Launcher,
    name: str,
    *,
    env: dict[str, str],
    settings: dict[str, Any],
    checkpoint_dir: Path,
) -> Proc:
    """A node pod: ``ddp_trainer.node`` running torchrun standalone, one worker, no restarts
    (a worker that fails fails the pod: a survivor's crash shows)."""
    args = [
        "-m",
        "ddp_trainer.node",
        "--nproc-per-node=1",
        "--monitor-interval=0.5",
        "--max-restarts=0",
        "-m",
        "ddp_trainer",
        "--checkpoint-dir",
        str(checkpoint_dir),
    ]
    pet = {"PET_NNODES": "1", "PET_STANDALONE": "1"}
    full = subprocess_env(DDP_TRAINER_CONFIG=trainer_settings(settings), **pet, **env)
    return launcher.start(name, args, full)


@dataclass
class Warm:
    """A group forked by the zygote."""

    name: str
    pid: int
    log: Path
    code: int | None = None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Zygote:
    """The forking process (see the module docstring) and the groups it started."""

    popen: subprocess.Popen[bytes]
    workdir: Path
    groups: dict[int, Warm] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def start(cls, launcher: Launcher) -> Zygote:
        popen = subprocess.Popen(
            [sys.executable, str(Path(__file__))],
            cwd=launcher.workdir,
            env=subprocess_env(RUST_LOG="warn"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(launcher.workdir / "zygote.log", "wb"),  # noqa: SIM115
            start_new_session=True,
        )
        zygote = cls(popen, launcher.workdir)
        line = popen.stdout.readline() if popen.stdout else b""
        assert line.strip() == b"ready", line
        threading.Thread(target=zygote._read, daemon=True).start()
        return zygote

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            event = json.loads(line)
            with self._lock:
                if "exited" in event and event["exited"] in self.groups:
                    self.groups[event["exited"]].code = event["code"]

    def fork(
        self,
        name: str,
        *,
        env: dict[str, str],
        settings: dict[str, Any],
        checkpoint_dir: Path,
        rank: int = 0,
        nproc: int = 1,
        port: int | None = None,
    ) -> Warm:
        """One worker of a group: the environment torchrun standalone gives local rank ``rank``
        of ``nproc`` (whose store is rank 0's, on ``port``), around ``env``."""
        log = self.workdir / f"{name}.log"
        worker = {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(nproc),
            "LOCAL_WORLD_SIZE": str(nproc),
            "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port or free_port()),
            "TORCHELASTIC_RUN_ID": name,
            "TORCHELASTIC_RESTART_COUNT": "0",
        }
        full = subprocess_env(DDP_TRAINER_CONFIG=trainer_settings(settings), **worker, **env)
        command = {"env": full, "log": str(log), "args": ["--checkpoint-dir", str(checkpoint_dir)]}
        assert self.popen.stdin is not None
        reply = _Reply()
        with self._lock:
            self.popen.stdin.write((json.dumps(command) + "\n").encode())
            self.popen.stdin.flush()
        pid = reply.wait_for_pid(log)
        warm = Warm(name, pid, log)
        with self._lock:
            self.groups[pid] = warm
        return warm

    def kill(self, warm: Warm) -> None:
        """SIGKILL of the pod: its whole process group (session)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(warm.pid, signal.SIGKILL)

    def close(self) -> None:
        for warm in list(self.groups.values()):
            if warm.code is None:
                self.kill(warm)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)


class _Reply:
    """The pid of a forked group: its log's first line (the zygote's stdout is the exit
    reader's)."""

    def wait_for_pid(self, log: Path) -> int:
        line = wait_until(
            lambda: log.exists() and log.read_text().split("\n", 1)[0].startswith("pid "),
            30,
            f"the zygote to fork {log.name}",
        )
        assert line
        return int(log.read_text().split("\n", 1)[0].split()[1])


def sample_lines(folder: Path) -> list[dict[str, Any]]:
    """Every line of every process's sample log (a line torn by a SIGKILL is skipped)."""
    rows = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                rows.append({**json.loads(line), "file": path.name})
    return rows


def committed_step(folder: Path) -> int:
    """The highest step any group has committed (+1: the steps done)."""
    return max(steps_committed(folder), default=0)


def steps_committed(folder: Path, *, by: str = "", since: float = 0.0) -> list[int]:
    """The steps trained after each committed line (1-based) of the processes whose sample log
    names start with ``by`` (a group's replica id and "-", such as "job-0-"; "": every group),
    written after ``since`` (a ``time.time()``)."""
    return [
        r["step"] + 1
        for r in sample_lines(folder)
        if r["event"] == "committed" and r["file"].startswith(by) and r["time"] > since
    ]


def trained_together(folder: Path, groups: int, steps: int) -> bool:
    """Whether ``groups`` groups have committed a step together, past ``steps`` steps."""
    return any(
        r["event"] == "committed" and r["groups"] == groups and r["step"] >= steps
        for r in sample_lines(folder)
    )


def scaler_by_step(folder: Path, total: int) -> list[tuple[float, int]]:
    """The fp16 GradScaler's (scale, growth count) after each step 0..total-1, checked: every
    group committed the step with the same ones, and from each step to the next the scaler made
    exactly one update (the count one more at the same scale, or the scale halved after an
    overflow and the count from 0). A scaler also updated on a try that was not committed would
    be a count ahead; one that a heal left out would differ from its peers'."""
    by_step: dict[int, set[tuple[float, int]]] = {}
    for row in sample_lines(folder):
        if row["event"] == "committed":
            by_step.setdefault(row["step"], set()).add((row["scale"], row["growth"]))
    assert sorted(by_step) == list(range(total)), "steps never committed"
    assert all(len(seen) == 1 for seen in by_step.values()), by_step  # every group alike
    scaler = [by_step[step].pop() for step in range(total)]
    for step, ((scale, growth), after) in enumerate(itertools.pairwise(scaler), start=1):
        assert after in {(scale, growth + 1), (scale / 2, 0)}, (step, scaler)  # one update
    return scaler


# the zygote itself -------------------------------------------------------------------------


def _serve() -> None:
    preload(per_step=True)  # what every group imports, once, as a node pod's supervisor does

    sys.stdout.write("ready\n")
    sys.stdout.flush()
    children: set[int] = set()
    buffer = b""
    while True:
        readable, _, _ = select.select([sys.stdin], [], [], 0.05)
        if readable:
            chunk = os.read(sys.stdin.fileno(), 65536)
            if not chunk:
                break
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                children.add(_fork(json.loads(line)))
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                code = os.waitstatus_to_exitcode(status)
                sys.stdout.write(json.dumps({"exited": pid, "code": code}) + "\n")
                sys.stdout.flush()


def _fork(command: dict[str, Any]) -> int:
    """A group in a child of its own session, its output in its log, run as torchrun's warm
    workers are (:func:`ddp_trainer.launch.warm.run_trainer`)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    try:
        os.setsid()
        out = os.open(command["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(out, f"pid {os.getpid()}\n".encode())
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    run_trainer(command["args"], command["env"])


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    _serve()
