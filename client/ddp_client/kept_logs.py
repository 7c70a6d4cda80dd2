"""The logs a job's nodes kept on its checkpoint volume, without I/O: what the reader pod printed
(:mod:`ddp_client.log_dump`) turned back into each node's lines, oldest first, ready to merge in
time order like the pods' own logs (``kubectl ddp logs`` once the pods are gone)."""

from __future__ import annotations

import base64
import gzip
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from ddp_api.contract import parse_kept_log_name
from ddp_api.pods import worker_index

from .log_dump import BEGIN, END, OMITTED
from .loglines import LogLine, parse_pod_log


@dataclass
class Dump:
    """What the reader pod printed: the files it carried, and those it left out (and sizes)."""

    files: dict[str, bytes] = field(default_factory=dict)
    omitted: dict[str, int] = field(default_factory=dict)


def parse_dump(text: str) -> Dump:
    """The files of the reader pod's output; a file cut short (the pod's log was) is left out."""
    out = Dump()
    name: str | None = None
    chunks: list[str] = []
    for line in text.splitlines():
        head, _, rest = line.partition(" ")
        if name is None and head == BEGIN:
            name, chunks = rest, []
        elif name is None and head == OMITTED:
            file, _, size = rest.rpartition(" ")
            out.omitted[file] = int(size) if size.isdigit() else 0
        elif name is not None and line == END:
            try:
                out.files[name] = gzip.decompress(base64.b64decode("".join(chunks)))
            except (ValueError, OSError, EOFError, zlib.error):
                out.omitted[name] = 0
            name = None
        elif name is not None:
            chunks.append(line)
    return out


def node_logs(
    files: Mapping[str, bytes], job: str, since_ns: int | None = None
) -> list[list[LogLine]]:
    """Each node's kept lines in the order they were written (its rotated files oldest first),
    by node index: only ``job``'s nodes, and only lines from ``since_ns`` on (a job made
    earlier under the same name kept its own lines in the same folder)."""
    parts: dict[str, list[tuple[int, bytes]]] = {}
    for name, data in files.items():
        parsed = parse_kept_log_name(name)
        if parsed is not None and worker_index(job, parsed[0]) is not None:
            parts.setdefault(parsed[0], []).append((parsed[1], data))
    logs = []
    for pod in sorted(parts, key=lambda p: worker_index(job, p) or 0):
        text = b"".join(data for _, data in sorted(parts[pod], reverse=True))
        lines = parse_pod_log(text.decode(errors="replace"), pod, worker_index(job, pod))
        logs.append([line for line in lines if since_ns is None or line.at >= since_ns])
    return logs


def omitted_note(omitted: Mapping[str, int], job: str) -> str | None:
    """What a user is told when the reader pod left files out; None when it left none."""
    if not omitted:
        return None
    mib = sum(omitted.values()) / 2**20
    nodes = sorted(
        {
            f"node-{worker_index(job, p[0])}"
            for p in map(parse_kept_log_name, omitted)
            if p is not None and worker_index(job, p[0]) is not None
        }
    )
    return (
        f"{len(omitted)} older kept files of {', '.join(nodes)} ({mib:.1f} MiB) do not fit in"
        " what one reader pod's log carries: those nodes' lines start later"
    )
