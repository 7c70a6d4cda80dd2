"""Memory of a resume: the peak RSS a process adds while it loads a checkpoint into its model.

    python bench/resume_memory.py [--mb 300]

Writes a checkpoint of about ``--mb`` MB through ``CheckpointStore.write`` (a stack of 2048-wide
linear layers with its Adam state, as the trainer's checkpoints hold a model and its optimizer),
then, each in a fresh process that has built the model and optimizer first:

- before: the previous release's read, reproduced here: the whole file read into bytes, its
  SHA-256 checked, ``torch.load`` from a BytesIO;
- after: ``CheckpointStore.latest()`` (the SHA-256 checked a block at a time, ``torch.load``
  with ``mmap=True``);
- no_mmap: the same check, then ``torch.load`` of the path without ``mmap`` (for comparison);

then ``load_state_dict`` into the model and the optimizer, and then the first optimizer step
(which writes the whole optimizer state: with ``mmap`` it is only then copied out of the file's
pages). Peak extra = VmHWM after the load (and after that step) minus VmRSS before the load,
with the peak reset just before it (``/proc/self/clear_refs``); the gradients exist before.
Memory-mapped pages that are touched count in RSS (as file pages, shared with the page cache and
with the other processes of a node that map the same file): they are counted here. The writes
are measured the same way: ``write_before`` (the whole file serialized into memory first, as the
previous release did) and ``write_after`` (``CheckpointStore.write``, streamed to the file).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import repo_paths

repo_paths.add()

WIDTH = 2048
MB = 1 << 20


def build(layers: int) -> tuple[Any, Any]:
    import torch

    model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def layers_for(mb: float) -> int:
    """Layers whose weights and Adam state (3 floats a parameter) make about ``mb`` MB."""
    per_layer = 3 * 4 * (WIDTH * WIDTH + WIDTH)
    return max(1, round(mb * MB / per_layer))


def status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS


def trained_state(layers: int) -> dict[str, Any]:
    import torch

    from ddp_trainer.state.store import FORMAT

    model, optimizer = build(layers)
    model(torch.randn(2, WIDTH)).sum().backward()
    optimizer.step()  # the Adam state exists
    return {"format": FORMAT, "model": model.state_dict(), "optimizer": optimizer.state_dict()}


def child(mode: str, directory: Path, layers: int) -> dict[str, Any]:
    """One measurement, in this (fresh) process."""
    import torch

    from ddp_trainer.state.store import CheckpointStore, checkpoint_name

    torch.set_num_threads(1)
    store = CheckpointStore(directory)
    if mode.startswith("write"):
        state = trained_state(layers)
        reset_peak()
        base = status_kb("VmRSS")
        if mode == "write_before":
            buffer = io.BytesIO()
            torch.save(state, buffer)
            serialized = buffer.getbuffer()
            hashlib.sha256(serialized).hexdigest()
            (directory / "before.pt").write_bytes(serialized)
            del serialized, buffer
            (directory / "before.pt").unlink()
        else:
            store.write(2, state)
        return {"peak_extra_kb": status_kb("VmHWM") - base}
    model, optimizer = build(layers)
    inputs = torch.randn(2, WIDTH)
    model(inputs).sum().backward()  # the gradients exist before the load, as in training
    reset_peak()
    base, base_file = status_kb("VmRSS"), status_kb("RssFile")
    if mode == "before":
        data = (directory / checkpoint_name(1)).read_bytes()
        hashlib.sha256(data).hexdigest()
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        del data
    elif mode == "no_mmap":
        entry = store.entries()[-1]
        path = directory / entry.name
        sha256 = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(MB):
                sha256.update(block)
        assert sha256.hexdigest() == entry.sha256
        state = torch.load(path, map_location="cpu", weights_only=True)
    else:
        found = store.latest()
        assert found is not None
        state = found[1]
        del found
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    del state
    loaded = {"peak_extra_kb": status_kb("VmHWM") - base}
    loaded["rss_file_extra_kb"] = status_kb("RssFile") - base_file
    optimizer.step()  # the first step after the resume writes the whole optimizer state
    loaded["peak_extra_kb_with_step"] = status_kb("VmHWM") - base
    return loaded


def measure(mode: str, directory: Path, layers: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": repo_paths.source_path(), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            mode,
            "--dir",
            str(directory),
            "--layers",
            str(layers),
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=300.0, help="checkpoint size, about")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--layers", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.dir, args.layers)))
        return

    import torch

    from ddp_trainer.state.store import CheckpointStore

    layers = layers_for(args.mb)
    with tempfile.TemporaryDirectory(prefix="resume-memory-") as folder:
        directory = Path(folder)
        entry = CheckpointStore(directory).write(1, trained_state(layers))
        size_mb = (entry.size or 0) / MB
        model_mb = sum(p.numel() * 4 for p in build(layers)[0].parameters()) / MB
        runs = {mode: measure(mode, directory, layers) for mode in ("before", "after", "no_mmap")}
        writes = {
            mode: measure(mode, directory, layers) for mode in ("write_before", "write_after")
        }

    def extra_mb(run: dict[str, Any], which: str = "") -> float:
        return round(run["peak_extra_kb" + which] / 1024, 1)

    print(
        json.dumps(
            {
                "checkpoint_mb": round(size_mb, 1),
                "model_mb": round(model_mb, 1),
                "peak_extra_mb_before": extra_mb(runs["before"]),
                "peak_extra_mb_after": extra_mb(runs["after"]),
                "peak_extra_mb_no_mmap": extra_mb(runs["no_mmap"]),
                "ratio_before": round(extra_mb(runs["before"]) / size_mb, 3),
                "ratio_after": round(extra_mb(runs["after"]) / size_mb, 3),
                "ratio_no_mmap": round(extra_mb(runs["no_mmap"]) / size_mb, 3),
                "after_mapped_mb_when_loaded": round(runs["after"]["rss_file_extra_kb"] / 1024, 1),
                "with_first_step_peak_extra_mb_before": extra_mb(runs["before"], "_with_step"),
                "with_first_step_peak_extra_mb_after": extra_mb(runs["after"], "_with_step"),
                "with_first_step_peak_extra_mb_no_mmap": extra_mb(runs["no_mmap"], "_with_step"),
                "with_first_step_ratio_after": round(
                    extra_mb(runs["after"], "_with_step") / size_mb, 3
                ),
                "write_peak_extra_mb_before": extra_mb(writes["write_before"]),
                "write_peak_extra_mb_after": extra_mb(writes["write_after"]),
                "torch": torch.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
