"""Starts real torchrun agents ("nodes"), a rendezvous store and lone trainers on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ddp_api import rdzv_store
from ddp_devcluster.paths import source_path
from ddp_devcluster.procs import descendants, free_port, freeze_tree, kill_tree

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
T = TypeVar("T")

# torchrun's default of sharing the rendezvous TCPStore with the workers breaks
# re-rendezvous when membership changes (pytorch/pytorch#135712): a joining node waits
# for a MASTER_ADDR that the rank-0 agent only publishes in the first round. The
# operator's pods must set this too.
AGENT_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}

# Fast failure detection and re-rendezvous on loopback (production uses longer ones).
RDZV_CONF = (
    "join_timeout=120,last_call_timeout=2,close_timeout=10,read_timeout=20,"
    "keep_alive_interval=1,keep_alive_max_attempt=3"
)


def launcher_module(warm: bool) -> str:
    """The torchrun a test's agent runs: with warm workers (``ddp_trainer.launch.warm``: the
    agent forks each ddp_trainer worker, torch imported once) or plain."""
    return "ddp_trainer.launch.warm" if warm else "torch.distributed.run"


def trainer_settings(settings: dict[str, Any]) -> str:
    """DDP_TRAINER_CONFIG of a started trainer: no Prometheus endpoint unless the test asks for
    one, so that trainers on one host do not all reach for the default port."""
    return json.dumps({"metricsPort": 0, **settings})


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment of started processes: sources on the path, one thread, no leftovers."""
    dropped = ("DDPJOB_", "DDP_TRAINER_", "PET_", "TORCHELASTIC_")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(dropped)
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
        and k != "KUBECONFIG"
    }
    env["PYTHONPATH"] = os.pathsep.join([source_path(), str(HERE)])
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@dataclass
class Proc:
    """A started process group (an agent with its workers, a store, a lone trainer)."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def signal(self, signum: int) -> None:
        """Signal the process itself (torchrun forwards SIGTERM to its workers)."""
        if self.popen.poll() is None:
            self.popen.send_signal(signum)

    def kill_tree(self) -> None:
        """SIGKILL the process and all its descendants at once, like a node that dies."""
        kill_tree(self.popen.pid)

    def freeze_tree(self) -> None:
        """SIGSTOP the process and all its descendants, like a machine that goes silent."""
        freeze_tree(self.popen.pid)

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.name} still running after {timeout}s\n{self.tail()}"
            ) from None

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"--- {self.name} ({self.log}) ---\n" + "\n".join(text.splitlines()[-lines:])

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass
class Launcher:
    """Starts processes under `workdir` and kills whatever is left at teardown."""

    workdir: Path
    procs: list[Proc] = field(default_factory=list)

    def start(self, name: str, args: list[str], env: dict[str, str]) -> Proc:
        log = self.workdir / f"{name}.log"
        with open(log, "wb") as out:
            popen = subprocess.Popen(
                [sys.executable, *args],
                cwd=self.workdir,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def store(self, port: int | None = None, name: str = "rdzv-store") -> tuple[Proc, str]:
        """The dedicated rendezvous store; returns it and its HOST:PORT."""
        port = port or free_port()
        proc = self.start(
            name,
            ["-c", rdzv_store.program(), "--host", "127.0.0.1", "--port", str(port)],
            subprocess_env(),
        )
        wait_until(lambda: "listening" in proc.output(), 60, "the rendezvous store to listen")
        return proc, f"127.0.0.1:{port}"

    def agents(self, names: Sequence[str], host: str | None = None, **common: Any) -> list[Proc]:
        """One :meth:`node` a name, each with ``common``; ``host`` names the agent that hosts
        the c10d store (torchrun's default: the first), None: they join the test's own store."""
        return [self.node(name, is_host=name == host, **common) for name in names]

    def elastic_pair(
        self, names: tuple[str, str], settings: dict[str, Any], **common: Any
    ) -> tuple[Proc, Path, list[Proc]]:
        """The test's own store and two agents of an elastic job of 1 to 2 nodes on it, both
        writing to ``workdir/ckpt``: the store, that folder and the agents."""
        store, endpoint = self.store()
        ckpt = self.workdir / "ckpt"
        nodes = self.agents(
            names, endpoint=endpoint, nnodes="1:2", settings=settings, checkpoint_dir=ckpt, **common
        )
        return store, ckpt, nodes

    def node(
        self,
        name: str,
        *,
        endpoint: str,
        nnodes: str,
        settings: dict[str, Any],
        checkpoint_dir: Path,
        nproc: int = 1,
        is_host: bool = False,
        rdzv_id: str = "job",
        max_restarts: int = 3,
        supervised: bool = False,
        warm: bool = True,
        rdzv_conf: str = RDZV_CONF,
        worker: str = "ddp_trainer",
        extra_env: dict[str, str] | None = None,
    ) -> Proc:
        """One torchrun agent (a node), c10d rendezvous on loopback, running ddp_trainer (or the
        module ``worker``, with ``extra_env``); ``supervised``: under ``ddp_trainer.node``, as the
        operator's pods run it; ``rdzv_conf``: its ``--rdzv-conf`` (``is_host`` comes from
        ``is_host``; False: an agent of the test's own store, :meth:`store`). ``warm``: the
        agent forks ddp_trainer's workers as the operator's CPU pods do
        (``ddp_trainer.launch.warm``); False: plain torchrun, each worker a fresh interpreter."""
        kept = [kv for kv in rdzv_conf.split(",") if kv and not kv.startswith("is_host=")]
        conf = ",".join([*kept, f"is_host={'true' if is_host else 'false'}"])
        args = [
            "-m",
            "ddp_trainer.node" if supervised else launcher_module(warm),
            f"--nnodes={nnodes}",
            f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id={rdzv_id}",
            f"--rdzv-conf={conf}",
            f"--max-restarts={max_restarts}",
            "--monitor-interval=0.5",
            "--local-addr=127.0.0.1",
            "-m",
            worker,
            "--checkpoint-dir",
            str(checkpoint_dir),
        ]
        warmth = {} if warm else {"DDPJOB_WARM_WORKERS": "0"}
        env = subprocess_env(
            DDP_TRAINER_CONFIG=trainer_settings(settings),
            **AGENT_ENV,
            **warmth,
            **(extra_env or {}),
        )
        return self.start(name, args, env)

    def standalone(
        self,
        name: str,
        *,
        nproc: int,
        settings: dict[str, Any],
        checkpoint_dir: Path,
        extra_env: dict[str, str] | None = None,
    ) -> Proc:
        """A single-node torchrun (`--standalone`) with `nproc` workers (forked warm)."""
        args = [
            "-m",
            launcher_module(warm=True),
            "--standalone",
            f"--nproc-per-node={nproc}",
            "--monitor-interval=0.5",
            "-m",
            "ddp_trainer",
            "--checkpoint-dir",
            str(checkpoint_dir),
        ]
        env = subprocess_env(DDP_TRAINER_CONFIG=trainer_settings(settings), **(extra_env or {}))
        return self.start(name, args, env)

    def alone(
        self,
        name: str,
        *,
        settings: dict[str, Any],
        checkpoint_dir: Path,
        extra_env: dict[str, str] | None = None,
    ) -> Proc:
        """`python -m ddp_trainer` in one process, without torchrun."""
        env = subprocess_env(DDP_TRAINER_CONFIG=trainer_settings(settings), **(extra_env or {}))
        return self.start(name, ["-m", "ddp_trainer", "--checkpoint-dir", str(checkpoint_dir)], env)

    def kill_all(self) -> None:
        for proc in self.procs:
            proc.kill_tree()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(10)

    def logs(self) -> str:
        return "\n".join(p.tail() for p in self.procs)


def wait_until(predicate: Callable[[], T], timeout: float, what: str, every: float = 0.05) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def node_of(marker: Path, nodes: Sequence[Proc], timeout: float, what: str) -> Proc:
    """The one of ``nodes`` whose process tree holds the process that wrote its pid to
    ``marker`` (a test plugin's, where it waits), once it has (``what``, within ``timeout``)."""
    wait_until(lambda: marker.exists() and marker.read_text(), timeout, what)
    pid = int(marker.read_text())
    (node,) = [n for n in nodes if pid in descendants(n.popen.pid)]
    return node


def metrics(directory: Path) -> list[dict[str, Any]]:
    from ddp_trainer.reporting.run_log import read_run_log

    return read_run_log(directory)


def events(directory: Path, kind: str) -> list[dict[str, Any]]:
    return [line for line in metrics(directory) if line["event"] == kind]


def checkpoint_files(folder: Path) -> dict[str, bytes]:
    """What a checkpoint folder holds of the run (its checkpoints, manifest, completion record),
    by name: every file in it but the run log (a PerStep folder's beats and logs are folders)."""
    return {
        p.name: p.read_bytes()
        for p in folder.iterdir()
        if p.is_file() and p.name != "metrics.jsonl"
    }


def last_step(directory: Path) -> int:
    steps = events(directory, "step")
    return steps[-1]["step"] if steps else 0
