"""The node supervisor's decisions: restart torchrun only after losing the store; its flags;
its store probe against a real TCPStore; torchrun's exit codes from the forked child."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from torch.distributed import TCPStore
from trainer_harness import Launcher, subprocess_env, wait_until

from ddp_api import rdzv_store
from ddp_devcluster.procs import free_port
from ddp_trainer.launch import store_probe, supervisor
from ddp_trainer.launch.exits import (
    clear_why,
    exit_code,
    say_why,
    termination_log,
    termination_text,
)
from ddp_trainer.launch.last_words import LastWords
from ddp_trainer.launch.settings import restarts_allowed, torchrun_setting
from ddp_trainer.launch.store_probe import STORE_ID_KEY, read_store_id, split_endpoint
from ddp_trainer.launch.supervisor import Outcome, after_exit


def test_node_restarts_torchrun_only_when_its_store_was_lost() -> None:
    assert after_exit(0, "a", "a", 3, stopping=False) == Outcome(False, 0, "torchrun finished")
    failed = after_exit(1, "a", "a", 3, stopping=False)
    assert not failed.restart and failed.code == 1 and "exit code 1" in failed.reason
    replaced = after_exit(1, "a", "b", 3, stopping=False)
    assert replaced.restart and "was replaced" in replaced.reason
    gone = after_exit(1, "a", None, 3, stopping=False)
    assert gone.restart and "no longer answers" in gone.reason
    spent = after_exit(1, "a", "b", 0, stopping=False)
    assert not spent.restart and spent.code == 1 and "no store-loss restarts" in spent.reason
    assert not after_exit(143, "a", None, 3, stopping=True).restart  # SIGTERM: the pod goes
    assert not after_exit(1, None, "b", 3, stopping=False).restart  # never joined one


def test_node_reads_torchrun_flags_like_torchrun() -> None:
    env = {"PET_RDZV_ENDPOINT": "job-rdzv.ns.svc:29400", "PET_MAX_RESTARTS": "5"}
    assert torchrun_setting(["--module", "ddp_trainer"], env, "rdzv-endpoint") == (
        "job-rdzv.ns.svc:29400"
    )
    args = ["--rdzv-endpoint=127.0.0.1:7", "--max_restarts", "2", "-m", "x", "--max-restarts=9"]
    assert torchrun_setting(args, env, "rdzv-endpoint") == "127.0.0.1:7"
    assert restarts_allowed(args, env) == 2  # flags before the program only
    assert restarts_allowed([], env) == 5 and restarts_allowed([], {}) == 3
    assert split_endpoint("job-rdzv.ns.svc:29400") == ("job-rdzv.ns.svc", 29400)
    assert split_endpoint("[::1]:29400") == ("::1", 29400)
    assert split_endpoint("store") == ("store", 29400)


def test_the_probe_reads_the_store_id_and_says_none_when_nothing_listens() -> None:
    port = free_port()
    assert read_store_id(f"127.0.0.1:{port}", 1.0) is None  # refused: no TCPStore backoff
    store = TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=5))
    store_id = uuid.uuid4().hex
    store.set(STORE_ID_KEY, store_id)
    assert read_store_id(f"127.0.0.1:{port}", 1.0) == store_id
    del store
    assert read_store_id(f"127.0.0.1:{port}", 1.0) is None  # the store went


# Before the store's program or the node wrapper: a thread that sends SIGTERM to itself once the
# trigger exists (a signal taken by a thread other than the main one, as by one of the TCPStore's
# threads or the wrapper's).
SIGTERM_ELSEWHERE = """
import os, signal, threading, time
def sigterm_here(trigger):
    while not os.path.exists(trigger):
        time.sleep(0.05)
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
threading.Thread(target=sigterm_here, args=({trigger!r},), daemon=True).start()
"""


@pytest.mark.parametrize("taken_by", ["main", "other"], ids=["sigterm", "sigterm-elsewhere"])
def test_the_store_pods_program_needs_only_torch_and_stops_on_sigterm(
    tmp_path: Path, taken_by: str
) -> None:
    # The store pod runs in the job's image, which may be the user's (no ddp_* there): a
    # program that imports one of ours must fail here, as it would in such a pod (seen on kind
    # with the trainer's old `python -m ddp_trainer.rdzv_store`: ModuleNotFoundError, the
    # store crash-looping, the job Running with no rendezvous). It stops on SIGTERM also when
    # another thread took the signal (before, its main thread slept on in one Event.wait).
    port = free_port()
    ours = "import sys; sys.modules.update(ddp_api=None, ddp_trainer=None, ddp_operator=None)"
    trigger = tmp_path / "sigterm"
    if taken_by == "other":
        ours += SIGTERM_ELSEWHERE.format(trigger=str(trigger))
    program = rdzv_store.program()
    run = f"{ours}\nexec(compile({program!r}, 'store', 'exec'))"
    proc = subprocess.Popen(
        [sys.executable, "-c", run, "--host", "127.0.0.1", "--port", str(port)],
        env=subprocess_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while (store_id := read_store_id(f"127.0.0.1:{port}", 1.0)) is None:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the store never answered"
            time.sleep(0.2)
        assert len(store_id) == 32  # a new random id per start
        if taken_by == "other":
            trigger.touch()
        else:
            proc.send_signal(signal.SIGTERM)
        # It answers until its process ends. It closed the store and then tore torch down, 0.7 s
        # in which the kubelet's readiness probe was refused: a Warning event on the pod.
        stopping = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
            except OSError:  # refused, or reset from the backlog of a closed listener
                break
            assert time.monotonic() < stopping, "the store still answers 10 s after SIGTERM"
            time.sleep(0.01)
        # An ending process closes its files last but for telling its parent (microseconds).
        try:
            code = proc.wait(timeout=0.25)
        except subprocess.TimeoutExpired:
            raise AssertionError("the store stopped answering while still running") from None
        assert code == 0
    finally:
        proc.kill()
    assert "rendezvous store listening on 127.0.0.1" in (proc.stderr.read() if proc.stderr else "")


def test_torchruns_exit_is_passed_on_as_python_would_exit() -> None:
    assert exit_code(SystemExit()) == 0 and exit_code(SystemExit(None)) == 0
    assert exit_code(SystemExit(3)) == 3
    assert exit_code(SystemExit("usage: torchrun ...")) == 1  # a message: Python exits 1


LINGERING = """
import sys, threading
from concurrent.futures import ThreadPoolExecutor
from ddp_trainer.launch.exits import leave

stuck = threading.Event()
pool = ThreadPoolExecutor(max_workers=1)  # as torchft's Manager keeps one
pool.submit(stuck.wait)
pool.shutdown(wait=False)
print("trained", end="")  # unflushed: leave() flushes it
if sys.argv[1] == "leave":
    leave(lambda: 3)
sys.exit(3)
"""


def test_a_worker_exits_with_its_code_though_a_library_thread_never_ends() -> None:
    """What a worker leaves behind (an executor's thread that never ends) holds a plain exit at
    ``concurrent.futures``' exit-time join; :func:`leave` exits with the code at once."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = [sys.executable, "-c", LINGERING]
    done = subprocess.run([*run, "leave"], env=env, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (3, "trained"), done.stderr
    with pytest.raises(subprocess.TimeoutExpired):  # the plain exit waits on the thread
        subprocess.run([*run, "plain"], env=env, capture_output=True, timeout=3)


# The node supervisor's entry, with torchrun's run replaced by what its store watch does: a
# thread that reads the store's id again and again, from a store that has published none yet
# (a new store pod's first moment): each read a TCPStore client's get that times out.
PROBING = """
import runpy, sys, threading
import torch.distributed.run  # as the supervisor imports it before any probe
from ddp_trainer.launch import store_probe, supervisor

tried = threading.Event()

def probe():
    while True:
        try:  # read_store_id's store calls
            store = store_probe.open_store("127.0.0.1", int(sys.argv[1]), 0.05, serve=False)
            store.get(store_probe.STORE_ID_KEY)
        except Exception:
            tried.set()

def supervise(args, kept):
    threading.Thread(target=probe, daemon=True).start()
    tried.wait()
    return 3

supervisor.supervise = supervise
runpy.run_module("ddp_trainer.node", run_name="__main__")
"""


def test_the_node_exits_with_its_code_though_a_store_probe_is_still_waiting() -> None:
    """A node pod's process ended with SIGABRT or SIGSEGV (exit code 134 or 139, on kind as on
    loopback) now and then after training or a store's replacement: Python's teardown with a
    store probe's thread inside a TCPStore call aborts (``terminate called without an active
    exception``). The node exits as its workers do, at once with its code."""
    port = free_port()
    _serving = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    run = [sys.executable, "-c", PROBING, str(port)]
    for _ in range(3):  # each aborted (-6) before the node exited as its workers do
        done = subprocess.run(
            run, env=subprocess_env(), capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 3, done.stderr[-2000:]


def test_a_failed_worker_says_why_once_per_start_in_the_termination_message(tmp_path) -> None:
    """The first failure of a start is kept (later ones in the pod are mostly its
    consequences); the supervisor clears it before the next start. Outside a pod, where the
    kubelet mounted no /dev/termination-log and no file is named, nothing is written."""
    why = tmp_path / "termination-log"
    env = {"DDPJOB_TERMINATION_LOG": str(why)}
    assert termination_log(env) == why
    assert termination_log({}) is None or Path("/dev/termination-log").is_file()
    cause = termination_text(ValueError("the corpus\n  has no text"))
    assert cause == "ValueError: the corpus has no text"
    say_why(cause, env)
    say_why(termination_text(RuntimeError("Connection reset by peer")), env)
    assert why.read_text() == cause
    clear_why(env)
    say_why(termination_text(KeyboardInterrupt()), env)
    assert why.read_text() == "KeyboardInterrupt"
    long = termination_text(OSError("x" * 5000))
    assert len(long) == 1024 and long.endswith("...")
    say_why("never raises", {"DDPJOB_TERMINATION_LOG": str(tmp_path / "no" / "such" / "dir")})


RAISES = """
import sys
from ddp_trainer.launch.exits import leave
class SignalException(Exception):  # torch's name for what SIGTERM raises in torchrun's agent
    pass
def run():
    raise (SignalException if sys.argv[1] == "signal" else ValueError)("Process 12 got signal: 15")
leave(run)
"""


def test_a_worker_that_raises_says_why_on_exit_and_one_told_to_stop_does_not(tmp_path) -> None:
    for kind, said in (("value", "ValueError: Process 12 got signal: 15"), ("signal", None)):
        why = tmp_path / f"termination-log-{kind}"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        env["DDPJOB_TERMINATION_LOG"] = str(why)
        run = [sys.executable, "-c", RAISES, kind]
        done = subprocess.run(run, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1
        assert (why.read_text() if why.exists() else None) == said
        if said:
            assert "Traceback" in done.stderr
        else:  # the pod was told to stop: one line, no traceback in every stopped pod's log
            assert done.stderr == "stopping: SignalException: Process 12 got signal: 15\n"


TRACEBACKS = """\
[rank1]: Traceback (most recent call last):
[rank0]: Traceback (most recent call last):
[rank1]:   File "/scripts/train.py", line 9, in <module>
[rank0]:   File "/scripts/train.py", line 7, in <module>
[rank0]:     load(corpus)
[rank0]:     ^^^^^^^^^^^^
[rank1]:     dist.all_reduce(t)
[rank0]: ValueError: the corpus
[rank0]: has no text
[rank1]: torch.distributed.DistBackendError: Connection reset by peer
Traceback (most recent call last):
  File "/opt/venv/bin/torchrun", line 8, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
"""


def test_a_scripts_first_exception_is_read_from_its_output_and_torchruns_summary_is_not() -> None:
    words = LastWords()
    for line in TRACEBACKS.encode().splitlines():
        words.feed(line)
    assert words.said == "ValueError: the corpus"
    summary = LastWords()
    for line in TRACEBACKS.encode().splitlines()[10:]:
        summary.feed(line)
    assert summary.said == ""  # torchrun's ChildFailedError is no worker's cause
    module = LastWords()
    for line in (b"Traceback (most recent call last):", b'  File "x"', b"a.b.KeyError: 'lr'"):
        module.feed(line)
    assert module.said == "KeyError: 'lr'"


SYNTAX = """\
[rank0]:   File "/scripts/train.py", line 3
[rank0]:     def (
[rank0]:         ^
[rank0]: SyntaxError: invalid syntax
"""
IMPORTED = """\
Traceback (most recent call last):
  File "/scripts/train.py", line 1, in <module>
    import helpers
  File "/scripts/helpers.py", line 2
    print(1)
    ^
IndentationError: expected an indented block after 'if' statement on line 1
"""


def test_a_script_that_does_not_compile_is_said_with_where_it_points() -> None:
    """Python prints no Traceback line for a script that does not compile; an imported
    module's SyntaxError points at that module, not at the frame that imported it."""
    for stream, expected in (
        (SYNTAX, "SyntaxError: invalid syntax (/scripts/train.py, line 3)"),
        (
            IMPORTED,
            "IndentationError: expected an indented block after 'if' statement on line 1"
            " (/scripts/helpers.py, line 2)",
        ),
        (TRACEBACKS, "ValueError: the corpus"),  # no location for other kinds
    ):
        words = LastWords()
        for line in stream.encode().splitlines():
            words.feed(line)
        assert words.said == expected


@pytest.mark.parametrize("volume", [True, False], ids=["kept-log", "no-volume"])
def test_a_supervised_scripts_failure_leaves_its_exception_as_the_termination_message(
    launcher: Launcher, volume: bool
) -> None:
    """A user's script under ``ddp_trainer.node`` (as ``kubectl ddp submit`` runs it, and a
    user's ``command: [python, -m, ddp_trainer.node]`` may) writes no termination message;
    the wrapper leaves its first worker's exception there, with or without a checkpoint
    volume to keep the log on."""
    why = launcher.workdir / "termination-log"
    args = ["-m", "ddp_trainer.node", "--standalone", "--nproc-per-node=2", "--max-restarts=0"]
    args += ["--monitor-interval=0.5", "-m", "raising_script"]
    ckpt = launcher.workdir / "ckpt"
    env = subprocess_env(DDPJOB_TERMINATION_LOG=str(why), POD_NAME="j-node-0")
    if volume:
        env["DDPJOB_CHECKPOINT_DIR"] = str(ckpt)
    node = launcher.start("script", args, env)
    assert node.wait(120) == 1, node.tail()
    assert why.read_text() == "ValueError: the corpus at /data/corpus.txt has no text"
    assert (ckpt / "logs" / "j-node-0.log").is_file() == volume
    assert "ValueError: the corpus" in node.output()  # relayed to the pod's log all the same


def test_a_supervised_script_that_does_not_compile_says_where(launcher: Launcher) -> None:
    """The commonest first failure of a submitted script, through the real wrapper."""
    why = launcher.workdir / "termination-log"
    script = launcher.workdir / "train.py"
    script.write_text("import os\ndef (\n")
    args = ["-m", "ddp_trainer.node", "--standalone", "--nproc-per-node=1", "--max-restarts=0"]
    args += ["--monitor-interval=0.5", str(script)]
    node = launcher.start("syntax", args, subprocess_env(DDPJOB_TERMINATION_LOG=str(why)))
    assert node.wait(120) == 1, node.tail()
    assert why.read_text() == f"SyntaxError: invalid syntax ({script}, line 2)"


# The node wrapper, after SIGTERM_ELSEWHERE's thread: the pod's SIGTERM taken by a thread other
# than the main one, as the kernel may hand it to any thread of the process that does not block
# it (the wrapper has relays, a kept-log writer and a store watch). Python runs the handler in
# the main thread, once that thread runs.
WRAPPER = """
from ddp_trainer.launch.exits import leave
from ddp_trainer.launch.supervisor import main
leave(main)
"""

WAITING_WORKER = """
import signal, sys, time
def stop(signum, frame):
    print("worker stopped by SIGTERM", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
print("worker ready", flush=True)
time.sleep(600)
"""


def test_a_sigterm_taken_by_another_thread_of_the_wrapper_still_reaches_the_workers(
    launcher: Launcher,
) -> None:
    """The wrapper passes SIGTERM on to torchrun, which tells the workers (they checkpoint),
    whichever of its threads took the signal: it looks for torchrun's exit between short
    sleeps. Blocked in one waitpid, its main thread never ran the handler: the workers went on
    until the kubelet's SIGKILL, with nothing saved."""
    trigger, script = launcher.workdir / "sigterm", launcher.workdir / "worker.py"
    script.write_text(WAITING_WORKER)
    wrapper = SIGTERM_ELSEWHERE.format(trigger=str(trigger)) + WRAPPER
    args = ["-c", wrapper, "--standalone", "--nproc-per-node=1"]
    args += ["--max-restarts=0", "--monitor-interval=0.5", str(script)]
    node = launcher.start("elsewhere", args, subprocess_env())
    wait_until(lambda: "worker ready" in node.output(), 60, "the worker to start")
    trigger.touch()
    node.wait(30)
    assert "worker stopped by SIGTERM" in node.output(), node.tail()


def test_a_node_of_a_completed_run_knows_it_from_the_completion_record(tmp_path) -> None:
    from ddp_trainer.launch.settings import checkpoint_folder, completed
    from ddp_trainer.state.store import CheckpointStore, read_completion

    assert read_completion(tmp_path) is None
    CheckpointStore(tmp_path).mark_complete("uid-1", 140, "step-00000140.pt")
    done = read_completion(tmp_path)
    assert done is not None and (done.run_id, done.step) == ("uid-1", 140)
    assert completed(done, "uid-1")
    assert not completed(done, "uid-2")  # another job reusing the folder trains
    assert not completed(done, None) and not completed(None, "uid-1")
    (tmp_path / "complete.json").write_text('{"runId": "uid-1", "st')  # torn: not complete
    assert read_completion(tmp_path) is None
    args = ["--nnodes=2", "-m", "ddp_trainer", "--checkpoint-dir", "/ck"]
    assert checkpoint_folder(args, {"DDPJOB_CHECKPOINT_DIR": "/env"}) == "/ck"
    assert checkpoint_folder(["-m", "ddp_trainer", "--checkpoint-dir=/eq"], {}) == "/eq"
    assert checkpoint_folder(["-m", "ddp_trainer"], {"DDPJOB_CHECKPOINT_DIR": "/env"}) == "/env"


def test_torchruns_exit_barrier_and_worker_stop_are_bounded(monkeypatch) -> None:
    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher import api

    from ddp_trainer.launch.settings import DEFAULT_EXIT_BARRIER_S, exit_barrier_s
    from ddp_trainer.launch.supervisor import bound_agent_waits

    assert exit_barrier_s({}) == DEFAULT_EXIT_BARRIER_S < 300
    assert exit_barrier_s({"DDPJOB_EXIT_BARRIER_S": "12.5"}) == 12.5
    assert exit_barrier_s({"DDPJOB_EXIT_BARRIER_S": "soon"}) == DEFAULT_EXIT_BARRIER_S
    monkeypatch.setattr(api, "LocalElasticAgent", api.LocalElasticAgent)  # restored after
    bound_agent_waits(7.0, stop_s=4)
    spec = WorkerSpec(role="t", local_world_size=1, rdzv_handler=None, entrypoint="x", args=())
    agent = api.LocalElasticAgent(spec=spec, logs_specs=DefaultLogsSpecs())  # as launch_agent
    assert agent._exit_barrier_timeout == 7.0
    # Workers stopped for a restart (a peer lost or added) get 4 s before SIGKILL, not 30.
    stops: list[int] = []
    monkeypatch.setattr(agent, "_shutdown", lambda timeout=30, **_: stops.append(timeout))
    agent._stop_workers(None)
    assert stops == [4]


def test_only_another_store_answering_means_the_joined_one_was_replaced() -> None:
    assert store_probe.store_replaced("a", "b")
    assert not store_probe.store_replaced("a", "a")
    # silent: maybe slow, maybe lost; torchrun judges
    assert not store_probe.store_replaced("a", None)
    assert not store_probe.store_replaced(None, "b")  # no store was joined (no endpoint)


def test_descendants_reach_grandchildren_in_other_sessions() -> None:
    script = (
        "import subprocess, sys, time;"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " start_new_session=True); time.sleep(60)"
    )
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        found: list[int] = []
        for _ in range(100):
            found = supervisor.descendants(parent.pid)
            if found:
                break
            time.sleep(0.05)
        assert len(found) == 1, found
        assert supervisor.descendants(found[0]) == []
    finally:
        for pid in [*supervisor.descendants(parent.pid), parent.pid]:
            os.kill(pid, signal.SIGKILL)
        parent.wait()


def test_a_store_that_accepts_but_never_answers_is_no_store_and_does_not_block() -> None:
    """What a frozen machine's store looks like: its kernel completes the TCP handshake (the
    listening socket's backlog), its process never replies."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # never accept()ed, never answered
        endpoint = f"127.0.0.1:{silent.getsockname()[1]}"
        assert store_probe.probe_store_id(endpoint, wait_s=3.0) is None


def test_a_node_that_ends_leaves_the_rendezvous_open_for_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a real TCPStore: torchrun's handler closes the c10d rendezvous when its agent ends
    (a failure, a peer waited for in vain), and the next node to join fails at once; with
    ``keep_rendezvous_open`` (what every node pod's torchrun runs with) the next node joins."""
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.api import RendezvousClosedError
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    from ddp_devcluster.procs import free_port
    from ddp_trainer.launch.supervisor import keep_rendezvous_open

    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)

    def handler(run_id: str) -> DynamicRendezvousHandler:
        params = RendezvousParameters(
            backend="c10d", endpoint=f"127.0.0.1:{port}", run_id=run_id, min_nodes=1,
            max_nodes=2, join_timeout="20", last_call_timeout="1",
        )  # fmt: skip
        h = get_rendezvous_handler(params)
        assert isinstance(h, DynamicRendezvousHandler)
        return h

    def ends_then_next_joins(run_id: str) -> None:
        first = handler(run_id)
        first.next_rendezvous()
        first.shutdown()  # what torchrun's launcher does when its agent fails
        handler(run_id).next_rendezvous()

    with pytest.raises(RendezvousClosedError):  # torchrun as it ships
        ends_then_next_joins("as-shipped")
    monkeypatch.setattr(DynamicRendezvousHandler, "shutdown", DynamicRendezvousHandler.shutdown)
    keep_rendezvous_open()
    ends_then_next_joins("kept-open")
    del store


# torchrun's own pieces, in a process of their own (it handles SIGTERM as torchrun does): its
# signal handler, and its log tailer's stop, which waits for the tailer threads. The tailer's
# write of the worker's line holds until the main thread is in that wait, then the SIGTERM comes.
SIGNAL_IN_TAIL_STOP = """
import io, os, signal, sys, time
from torch.distributed.elastic.multiprocessing import api
from torch.distributed.elastic.multiprocessing.tail_log import TailLog
from ddp_trainer.launch.supervisor import signals_deferred

signal.signal(signal.SIGTERM, api._terminate_process_handler)  # as torchrun's start does

class Held(io.StringIO):
    def write(self, text):
        tail._finished_events[0].wait()  # stop() has begun: it sets these, then waits
        time.sleep(0.5)  # for this thread, in Future.result()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)  # the handler runs in the main thread, in that wait
        return super().write(text)

def stop_under_a_signal():
    global tail
    tail = TailLog("default", {0: sys.argv[1]}, Held(), interval_sec=0.05)
    tail.start()
    tail.stop()

try:
    if sys.argv[2] == "deferred":
        with signals_deferred():
            stop_under_a_signal()
    else:
        stop_under_a_signal()
except api.SignalException as e:
    print("raised", e.sigval.name)
else:
    print("lost")
"""


@pytest.mark.parametrize(("how", "outcome"), [("torch", "lost"), ("deferred", "raised SIGTERM")])
def test_a_sigterm_while_torchrun_stops_its_workers_is_not_lost(
    tmp_path: Path, how: str, outcome: str
) -> None:
    """torch's log tailer swallows a SIGTERM that comes while its stop waits (it catches every
    Exception), so an agent stopping its workers for a restart went on to restart them in a pod
    being deleted; under ``signals_deferred`` (the agent's ``_stop_workers``) the signal is raised
    once the stop is done."""
    log = tmp_path / "worker.log"
    log.write_text("a worker's line\n")
    run = subprocess.run(
        [sys.executable, "-c", SIGNAL_IN_TAIL_STOP, str(log), how],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == outcome, (run.stdout, run.stderr[-3000:])
    if how == "torch":
        assert "error in log tailer" in run.stderr  # where torch lost it
