"""The run log: ``metrics.jsonl`` in the checkpoint folder, one JSON line per start, step,
checkpoint, hold and end (global rank 0 writes it; ``kubectl ddp plot`` draws it)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ddp_api.contract import RUN_LOG_FILE, parse_run_log

TAIL_BYTES = 64 * 1024  # many step lines: a writer reads back no further


class RunLog:
    """The run log: appends one JSON object per line to `metrics.jsonl` (global rank 0 only)."""

    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / RUN_LOG_FILE
        self._file = open(self.path, "a", buffering=1)  # noqa: SIM115 (lives as long as the run)

    def write(self, event: str, **fields: Any) -> None:
        """One line: ``event``, the time now (unless ``fields`` has one), ``fields``."""
        line = {"event": event, "time": round(time.time(), 3), **fields}
        self._file.write(json.dumps(line) + "\n")

    def last_step(self) -> int | None:
        """The step of the file's newest ``step`` line, whoever wrote it (None: none yet); reads
        at most its last TAIL_BYTES."""
        with open(self.path, "rb") as file:
            file.seek(max(0, file.seek(0, os.SEEK_END) - TAIL_BYTES))
            rows = parse_run_log(file.read().decode(errors="replace"))
        steps = [r.get("step") for r in rows if r.get("event") == "step"]
        return steps[-1] if steps else None

    def close(self) -> None:
        self._file.close()


def read_run_log(directory: Path | str) -> list[dict[str, Any]]:
    """The lines of a checkpoint folder's metrics.jsonl (a torn last line is ignored)."""
    path = Path(directory) / RUN_LOG_FILE
    if not path.exists():
        return []
    return parse_run_log(path.read_text())
