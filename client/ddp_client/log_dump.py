"""The program the client's reader pod runs (``python -c`` this module's source, standard library
only) to print a job's kept logs from its checkpoint volume, compressed, within a budget.

``FOLDER PREFIX BUDGET``: the files of ``FOLDER`` named ``PREFIX...`` (a job's nodes' kept logs,
``ddp_api.contract.kept_log_name``), each as a line ``ddp-kept-log NAME`` followed by its gzip in
base64 lines and ``ddp-kept-log-end``. The pod's log is read back through the API, which returns
only the kubelet's newest file of it (10 MiB by default): at most ``BUDGET`` bytes are printed,
the newest parts of every node first; each file left out (and every older one of its node) is a
line ``ddp-kept-log-omitted NAME SIZE``.
"""

from __future__ import annotations

import base64
import gzip
import os
import sys
from collections.abc import Callable, Iterable

BEGIN, END, OMITTED = "ddp-kept-log", "ddp-kept-log-end", "ddp-kept-log-omitted"


def part_of(name: str) -> int:
    """A kept file's rotation part: 0 for ``x.log``, 2 for ``x.log.2``."""
    _, _, suffix = name.rpartition(".log")
    return int(suffix[1:]) if suffix[1:].isdigit() else 0


def newest_first(names: Iterable[str]) -> list[str]:
    """Every node's current file, then every node's newest rotated one, and so on."""
    return sorted(names, key=lambda name: (part_of(name), name))


def encoded(data: bytes) -> bytes:
    return base64.encodebytes(gzip.compress(data, compresslevel=6))


def dump(
    folder: str, prefix: str, budget: int, write: Callable[[str], object] = sys.stdout.write
) -> None:
    try:
        names = [n for n in os.listdir(folder) if n.startswith(prefix) and ".log" in n]
    except FileNotFoundError:
        names = []
    used = 0
    cut: set[str] = set()  # nodes whose newer part was left out: so are the older ones
    for name in newest_first(names):
        pod = name[: name.rfind(".log")]
        path = os.path.join(folder, name)
        try:
            if pod in cut:
                write(f"{OMITTED} {name} {os.path.getsize(path)}\n")
                continue
            with open(path, "rb") as f:
                data = f.read()
        except OSError:  # rotated away meanwhile
            continue
        text = encoded(data).decode()
        if used + len(text) > budget:
            cut.add(pod)
            write(f"{OMITTED} {name} {len(data)}\n")
            continue
        used += len(text)
        write(f"{BEGIN} {name}\n{text}{END}\n")


if __name__ == "__main__":
    dump(sys.argv[1], sys.argv[2], int(sys.argv[3]))
