"""A test kubelet: real processes for the pods of a few Nodes of the embedded control plane.

For development and tests only, NOT for production: there are no images (the local Python
environment stands in for every image), no resource limits, no probes, and pods run as
root on the host's file system. What it does, as a kubelet would:

- registers its Nodes (label ``ddp.dev/test-kubelet=true``, no kwok annotation, so kwok
  leaves them alone) and keeps them Ready with a Lease in ``kube-node-lease``;
- runs every container of the pods bound to them as a process (``command + args`` with
  ``$(VAR)`` expansion; ``env``/``envFrom`` with fieldRef, configMapKeyRef, secretKeyRef),
  the venv's ``bin`` first on PATH and the caller's PYTHONPATH passed through;
- gives each pod a network namespace with its own IP on a bridge, private mount, UTS and
  PID namespaces, its volumes bind-mounted at their mountPath (emptyDir, claims, hostPath,
  configMap, secret, downwardAPI, projected ServiceAccount tokens) and cluster DNS;
- reports status (phase, conditions, containerStatuses), restarts containers per
  restartPolicy with a short backoff, and honours deletion (SIGTERM to the container's main
  process, SIGKILL of the whole pod after the grace period, then removes the pod).

Readiness probes are ignored: a container is ready while its process runs. Pod logs are
files, ``<state_dir>/logs/<ns>_<pod>_<uid>/<container>/<restartCount>.log``, with the time of
each line beside them (``.log.times``), and ``kubectl logs`` reads them through the API
server (``--follow``, ``--timestamps``, ``--tail``, ``--previous``, ``--since``,
``--limit-bytes``): every Node advertises a kubelet port where the agent serves
``/containerLogs`` over HTTPS at the node's InternalIP, with a serving certificate from the
plane's CA (self-signed when given only a kubeconfig), to clients with a certificate from
the cluster's CA (the API server's kubelet client certificate).

Use ``with TestKubelet(plane, nodes=["tk-0", "tk-1"]) as tk:`` (the agent runs in a child
process, ``python -m ddp_devcluster kubelet``), or the pytest fixture ``test_kubelet``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import netns
from .plane import ControlPlane, _die_with_parent

DEVCLUSTER_DIR = Path(__file__).resolve().parents[1]


class TestKubelet:
    """Runs the test kubelet agent for ``nodes`` against ``plane`` (or a ``kubeconfig``)."""

    __test__ = False  # not a pytest test class, despite the name

    def __init__(
        self,
        plane: ControlPlane | None = None,
        nodes: Sequence[str] = ("tk-0", "tk-1"),
        state_dir: Path | None = None,
        *,
        kubeconfig: Path | None = None,
        labels: dict[str, str] | None = None,
        network: str = "auto",
        python_path: Sequence[str | Path] = (),
        keep_nodes: bool = False,
        log: Callable[[str], None] = print,
        startup_timeout_s: float = 60,
    ) -> None:
        if plane is None and kubeconfig is None:
            raise ValueError("give a ControlPlane or a kubeconfig")
        self.plane = plane
        self.kubeconfig = kubeconfig or (plane.kubeconfig if plane else None)
        self.nodes = list(nodes)
        self._own_state = state_dir is None
        self.state_dir = Path(state_dir or tempfile.mkdtemp(prefix="ddp-test-kubelet-"))
        self.labels = labels or {}
        self.network = network
        extra = [str(Path(p).resolve()) for p in python_path]
        inherited = [p for p in os.environ.get("PYTHONPATH", "").split(":") if p]
        self.python_path = ":".join(dict.fromkeys([*extra, *inherited]))
        self.keep_nodes = keep_nodes
        self.log = log
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.info: dict[str, Any] = {}

    # -- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> TestKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def agent_log(self) -> Path:
        return self.state_dir / "kubelet.log"

    @property
    def instance(self) -> str:
        return str(self.info.get("instance", ""))

    @property
    def mode(self) -> str:
        """``netns`` (isolated pods) or ``loopback`` (the fallback without root)."""
        return str(self.info.get("mode", ""))

    def host_ip(self, node: str) -> str:
        return str(self.info["nodes"][node])

    @property
    def port(self) -> int:
        """The kubelet port of every node (``/containerLogs`` at ``host_ip(node)``)."""
        return int(self.info.get("kubelet_port", 0))

    def start(self) -> TestKubelet:
        t0 = time.monotonic()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        ready = self.state_dir / "ready.json"
        ready.unlink(missing_ok=True)
        argv = [
            sys.executable,
            "-m",
            "ddp_devcluster",
            "kubelet",
            f"--kubeconfig={self.kubeconfig}",
            f"--state-dir={self.state_dir}",
            f"--network={self.network}",
            f"--python-path={self.python_path}",
            f"--ready-file={ready}",
            *(
                [
                    f"--client-ca-file={self.plane.ca_file}",
                    "--serving-ca",
                    str(self.plane.ca_file),
                    str(self.plane.ca_key_file),
                ]
                if self.plane is not None
                else []
            ),
            *(f"--node={n}" for n in self.nodes),
            *(f"--label={k}={v}" for k, v in self.labels.items()),
            *(["--keep-nodes"] if self.keep_nodes else []),
        ]
        env = dict(os.environ)
        env["PYTHONPATH"] = ":".join(
            dict.fromkeys([str(DEVCLUSTER_DIR), *self.python_path.split(":")])
        )
        with self.agent_log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                preexec_fn=_die_with_parent,
            )
        deadline = time.monotonic() + self.startup_timeout_s
        try:
            while not ready.exists():
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the test kubelet exited:\n{self.tail()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the test kubelet did not start:\n{self.tail()}")
                time.sleep(0.1)
            self.info = json.loads(ready.read_text())
            while not self._nodes_ready():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"nodes {self.nodes} not Ready:\n{self.tail()}")
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise
        self.log(
            f"test kubelet ready in {time.monotonic() - t0:.1f}s: nodes {', '.join(self.nodes)} "
            f"({self.mode} network, logs in {self.state_dir})"
        )
        return self

    def _nodes_ready(self) -> bool:
        from .plane import kubectl_path

        out = subprocess.run(
            [
                kubectl_path(),
                f"--kubeconfig={self.kubeconfig}",
                "get",
                "nodes",
                *self.nodes,
                "-o",
                "json",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if out.returncode != 0:
            return False
        return all(_node_ready(n) for n in json.loads(out.stdout).get("items", []))

    def stop(self, timeout_s: float = 30) -> None:
        """Stop the agent: it kills its pods' processes, removes its Nodes (and the pods
        bound to them) unless ``keep_nodes``, and every namespace, link and mount."""
        p = self.proc
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.proc = None
        if self.info:
            netns.cleanup_stale()  # whatever a killed agent left behind
        if self._own_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the agent, like a node that dies: its pods' processes die with it, its
        Nodes stay (and go NotReady); the next start of any test kubelet cleans up."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.agent_log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # -- pods -----------------------------------------------------------------------------
    def log_path(
        self, namespace: str, pod: str, container: str, restart: int | None = None
    ) -> Path:
        """The log file of a container (the latest run unless ``restart`` is given)."""
        dirs = sorted(
            (self.state_dir / "logs").glob(f"{namespace}_{pod}_*/{container}"),
            key=lambda d: d.stat().st_mtime,
        )
        if not dirs:
            raise FileNotFoundError(f"no logs for {namespace}/{pod}/{container}")
        if restart is not None:
            return dirs[-1] / f"{restart}.log"
        return max(dirs[-1].glob("*.log"), key=lambda f: int(f.stem))

    def logs(self, namespace: str, pod: str, container: str, restart: int | None = None) -> str:
        try:
            return self.log_path(namespace, pod, container, restart).read_text(errors="replace")
        except (FileNotFoundError, ValueError):
            return ""

    def leftovers(self) -> list[str]:
        """Namespaces, links, mounts and processes of this instance that still exist."""
        inst = self.instance
        found = [f"process {pid}" for pid in netns.processes_with_env(netns.ID_ENV, inst)]
        if os.geteuid() == 0 and shutil.which("ip"):
            for line in netns.ip("netns", "list", check=False).splitlines():
                if line.startswith(f"{netns.PREFIX}-{inst}-"):
                    found.append(f"netns {line.split()[0]}")
            found += [f"link {n}" for n in netns._links() if n.startswith(f"{netns.PREFIX}{inst}")]
        found += [f"mount {m}" for m in netns.mounts_under(str(self.state_dir))]
        if (netns.run_dir() / f"{inst}.json").exists():
            found.append("registration")
        return found


def _node_ready(node: dict[str, Any]) -> bool:
    conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions") or []}
    taints = {t["key"] for t in node.get("spec", {}).get("taints") or []}
    return conds.get("Ready") == "True" and not taints & {
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    }


def main(argv: list[str]) -> int:
    from .kubelet_agent import main as agent_main

    return agent_main(argv)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main(sys.argv[1:]))
