"""One user of the kind cluster at a time on this machine.

The cluster is a machine-wide thing (podman containers named after it, kind's network, the
registry on a fixed port, the shared folder), and two of them do not fit on this disk. A test
session, the demo, ``make up`` and ``make down`` each hold the cluster's lock while they use
it: a second waits for the first, saying who that is, instead of reusing a cluster that is
being made or deleted under it. The lock is an ``flock``, so a holder that is killed lets go.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..paths import state_dir

Log = Callable[[str], None]
WAIT_S = 45 * 60  # a whole `make test` of another checkout fits in it
REPORT_EVERY_S = 30.0
HOLDER_ENV = "DDP_KIND_HOLDER"

_held: dict[Path, list[Any]] = {}  # lock path -> [open file, depth]: reentrant in a process


class InUse(TimeoutError):
    """Another process held the cluster for longer than this one would wait."""


def lock_path(name: str) -> Path:
    return state_dir() / f"kind-{name}.lock"


def holder_record(purpose: str) -> dict[str, Any]:
    """What a waiter is told about this process."""
    return {"pid": os.getpid(), "purpose": purpose, "cwd": os.getcwd(),
            "command": " ".join(sys.argv)[:300], "since": time.time()}  # fmt: skip


def describe(record: Mapping[str, Any] | None, now: float) -> str:
    """A holder as one phrase: ``pid 812 (the tests in /tmp/ci, for 3m05s)``."""
    if not record:
        return "another process"
    held = max(0, int(now - float(record.get("since", now))))
    return (f"pid {record.get('pid')} ({record.get('purpose', '?')} in {record.get('cwd', '?')}, "
            f"for {held // 60}m{held % 60:02d}s)")  # fmt: skip


def _read(f: Any) -> dict[str, Any] | None:
    f.seek(0)
    try:
        out = json.loads(f.read() or "null")
    except json.JSONDecodeError:
        return None
    return out if isinstance(out, dict) else None


def hold(name: str, purpose: str, log: Log = print, wait_s: float = WAIT_S) -> Callable[[], None]:
    """Takes the cluster's lock, waiting (and saying every 30 s for whom) while another
    process has it; returns what lets it go. Within one process a second hold only counts."""
    path = lock_path(name)
    if path in _held:
        _held[path][1] += 1
        return _releaser(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a+")  # noqa: SIM115 - kept open for as long as the lock is held
    if _held_by_an_ancestor(_read(f)):  # e.g. the demo that a test session runs
        f.close()
        return lambda: None
    t0 = time.monotonic()
    last = t0 - REPORT_EVERY_S  # the first refusal is said at once
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            now = time.monotonic()
            who = describe(_read(f), time.time())
            if now - t0 >= wait_s:
                f.close()
                raise InUse(
                    f"the kind cluster {name!r} has been in use by {who} for longer than this "
                    f"run waits ({wait_s:.0f}s); when it is finished, or if it hangs, stop it "
                    "and run `make down`"
                ) from None
            if now - last >= REPORT_EVERY_S:
                log(f"the kind cluster {name!r} is in use by {who}; waiting for it "
                    f"({now - t0:.0f}s so far)")  # fmt: skip
                last = now
            time.sleep(1.0)
    f.seek(0)
    f.truncate()
    f.write(json.dumps(holder_record(purpose)))
    f.flush()
    _held[path] = [f, 1]
    os.environ[HOLDER_ENV] = str(os.getpid())  # what this process starts may use the cluster
    return _releaser(path)


def ancestors(pid: int) -> list[int]:
    """The parent, grandparent, ... of a process of this machine (from /proc)."""
    out: list[int] = []
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the command's name
        out.append(pid)
    return out


def _held_by_an_ancestor(record: Mapping[str, Any] | None) -> bool:
    """Whether the holder is a process that started this one (through ``$DDP_KIND_HOLDER``,
    set while it holds the lock): a child of the holder uses the cluster on its behalf."""
    named = os.environ.get(HOLDER_ENV, "")
    pid = record.get("pid") if record else None
    return bool(named) and str(pid) == named and int(named) in ancestors(os.getpid())


def _releaser(path: Path) -> Callable[[], None]:
    """Lets go of one hold, once however often it is called; the last one unlocks."""
    done = False

    def release() -> None:
        nonlocal done
        entry = _held.get(path)
        if done or entry is None:
            return
        done = True
        entry[1] -= 1
        if entry[1] == 0:
            del _held[path]
            os.environ.pop(HOLDER_ENV, None)
            entry[0].seek(0)
            entry[0].truncate()
            fcntl.flock(entry[0], fcntl.LOCK_UN)
            entry[0].close()

    return release


@contextmanager
def held(name: str, purpose: str, log: Log = print) -> Iterator[None]:
    release = hold(name, purpose, log)
    try:
        yield
    finally:
        release()
