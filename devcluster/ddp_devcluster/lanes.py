"""`make test`'s suite as two pytest processes side by side, so that the two cores are used
while one tier waits on machines and the other on processes.

* ``nodes``: everything that runs containers on real kubelets, in order and never two at
  once (they share podman, the node images and the host's network): the four-machine kind
  cluster, made once: tests/cluster, the demo on it and then the end-to-end scenarios of
  tests/e2e (the cluster deleted after their last test); then the two longest modules of the
  embedded control plane's tests (kwok's machines), which need neither lane's resources and
  are here to even the lanes out (with them in ``procs``, 2026-11-29: ``procs`` 1550-1650 s
  to ``nodes``' 1100-1200 s on one machine, 1278 s to 1004 s on another; they take 130-170 s).
* ``procs``: the rest (the other control-plane tests, real torchrun processes on this
  machine, the packaging checks and the unit tests): every path under tests/ that ``nodes``
  does not name, found anew each run, so that a new test folder cannot be left out; a module
  of a folder that ``nodes`` names is left out of it with ``--ignore``.

Each lane's lines are printed as they come, prefixed with its name, a line per test (``-v``);
each lane has its own ``--basetemp`` and writes its whole output to ``<lane>.log`` beside it;
the exit status fails when either lane fails. The lanes' lines interleave, so a lane that
failed has its verdict lines (pytest's ``FAILED``/``ERROR`` summary) printed again last,
where the tail of a CI log shows them. With arguments this is plain ``pytest ARGS`` in one
process (``make test PYTEST_ARGS=...``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

TESTS = Path("tests")
NODES = (
    "tests/cluster",
    "tests/e2e",
    "tests/controlplane/test_operator.py",
    "tests/controlplane/test_ddp_cli.py",
)


def test_paths(tests: Path = TESTS) -> list[str]:
    """Every test folder and top-level test module under ``tests``, sorted."""
    found = [
        p
        for p in tests.iterdir()
        if (p.is_dir() and any(p.glob("test_*.py")))
        or (p.is_file() and p.name.startswith("test_") and p.suffix == ".py")
    ]
    return sorted(str(p) for p in found)


def split(paths: Sequence[str], nodes: Sequence[str] = NODES) -> dict[str, list[str]]:
    """The two lanes: ``nodes`` in its own order, ``procs`` the rest. Each of ``nodes`` is one
    of ``paths`` or a test module in one of its folders (which ``procs`` then ignores)."""

    def found(p: str) -> bool:
        return p in paths or (Path(p).is_file() and str(Path(p).parent) in paths)

    missing = [p for p in nodes if not found(p)]
    if missing:
        raise SystemExit(f"lanes: {', '.join(missing)} not found under tests/ (see NODES)")
    rest = [p for p in paths if p not in nodes]
    ignored = [f"--ignore={p}" for p in nodes if p not in paths]
    return {"nodes": list(nodes), "procs": rest + ignored}


def is_verdict(line: str) -> bool:
    """A line of pytest's short summary naming a test that failed or errored."""
    return line.startswith(("FAILED ", "ERROR "))


@dataclass
class Lane:
    name: str
    paths: list[str]
    proc: subprocess.Popen[str] | None = None
    started: float = 0.0
    took_s: float = 0.0
    verdicts: list[str] = field(default_factory=list)

    def start(self, basetemp: Path, lock: threading.Lock) -> threading.Thread:
        # -v: a line per test as it ends (the relay prints whole lines; pytest's dots would
        # show only when a file is done, minutes apart in the cluster tier)
        cmd = [sys.executable, "-m", "pytest", "-v", "--color=no", f"--basetemp={basetemp}",
               *self.paths]  # fmt: skip
        print(f"[{self.name}] {' '.join(cmd[1:])}", flush=True)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert self.proc.stdout is not None
        log = basetemp.parent / f"{self.name}.log"
        t = threading.Thread(target=self._relay, args=(self.proc.stdout, lock, log), daemon=True)
        t.start()
        return t

    def _relay(self, out: IO[str], lock: threading.Lock, log: Path) -> None:
        """Prints the lane's lines until its pytest ends (and writes them to ``log``), then
        times it: the lane's own time, however long the other one runs."""
        assert self.proc is not None
        with log.open("w") as f:
            for line in out:
                f.write(line)
                if is_verdict(line):
                    self.verdicts.append(line.rstrip("\n"))
                with lock:
                    sys.stdout.write(f"[{self.name}] {line}")
                    sys.stdout.flush()
        self.proc.wait()
        self.took_s = time.monotonic() - self.started


def run_lanes(lanes: dict[str, list[str]]) -> int:
    root = Path(tempfile.mkdtemp(prefix="ddp-test-"))
    lock = threading.Lock()
    running = [Lane(name, paths) for name, paths in lanes.items()]
    relays = [lane.start(root / lane.name, lock) for lane in running]
    try:
        for t in relays:
            t.join()
    except KeyboardInterrupt:
        for lane in running:
            if lane.proc is not None:
                lane.proc.terminate()
        for t in relays:
            t.join()
        raise
    codes = {lane.name: lane.proc.returncode for lane in running if lane.proc is not None}
    for lane in running:
        verdict = "passed" if codes[lane.name] == 0 else f"FAILED (pytest exit {codes[lane.name]})"
        print(f"lane {lane.name}: {verdict} in {lane.took_s:.0f}s ({' '.join(lane.paths)})")
    if all(c == 0 for c in codes.values()):
        shutil.rmtree(root, ignore_errors=True)
        return 0
    for lane in running:
        if codes[lane.name] != 0:
            print(f"lane {lane.name} failed on:")
            for line in lane.verdicts or ["(no test named: see the lane's lines above)"]:
                print(f"  {line}")
    print(f"the failed lanes' temporary files and logs are kept under {root}")
    return 1


def main(argv: Sequence[str]) -> int:
    if argv:
        return subprocess.call([sys.executable, "-m", "pytest", *argv])
    return run_lanes(split(test_paths()))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
