"""``make demo``: a real training job on this machine, with live progress.

Until the operator runs jobs end to end here, the demo brings up the embedded control plane
(to show it works) and runs the bundled trainer under torchrun locally: 2 processes, gloo,
the `digits` workload, checkpoints and metrics written to ``out/demo/``. It ends by printing
the checkpoint files, the final accuracy line and the path of a loss-curve PNG.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ddp_trainer.progress import read_metrics

from .plane import ControlPlane


def bar(done: int, total: int, width: int = 30) -> str:
    filled = int(width * done / total) if total else 0
    return "#" * filled + "-" * (width - filled)


def progress_line(row: dict[str, Any], total: int) -> str:
    """One line of the live view, from a trainer ``step`` event."""
    step = int(row.get("step", 0))
    head = f"[{bar(step, total)}] " if total else ""
    return (
        f"{head}epoch {row.get('epoch', '?')} step {step}/{total or '?'} "
        f"loss {float(row.get('loss', float('nan'))):.4f} "
        f"{float(row.get('samplesPerSecond', 0.0)):6.0f} samples/s "
        f"(world size {row.get('worldSize', '?')})"
    )


def plot(rows: list[dict[str, Any]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows if r.get("event") == "step"]
    loss = [r["loss"] for r in rows if r.get("event") == "step"]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, loss)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax.set_title("digits, 2 processes (gloo, bf16 autocast)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ddp-devcluster demo", description=__doc__)
    ap.add_argument("--out", type=Path, default=Path("out/demo"))
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--nproc", type=int, default=2)
    args = ap.parse_args(argv)
    out = args.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    ckpt = out / "checkpoints"
    ckpt.mkdir(parents=True)

    print("== 1/3 the embedded control plane")
    with ControlPlane(nodes=2) as cp:
        print(cp.kubectl("get", "nodes").stdout)

    print(f"== 2/3 training `digits` with torchrun: {args.nproc} processes, gloo, AMP auto")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={args.nproc}",
        "--module",
        "ddp_trainer",
        "--workload",
        "digits",
        "--epochs",
        str(args.epochs),
        "--checkpoint-dir",
        str(ckpt),
    ]
    log = (out / "train.log").open("w")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    shown, total = -1, 0
    while proc.poll() is None:
        rows = read_metrics(ckpt)
        total = next((int(r["totalSteps"]) for r in rows if r.get("event") == "start"), 0)
        steps = [r for r in rows if r.get("event") == "step"]
        if steps and steps[-1]["step"] != shown:
            shown = steps[-1]["step"]
            print("  " + progress_line(steps[-1], total), flush=True)
        time.sleep(1.0)
    if proc.returncode != 0:
        print((out / "train.log").read_text()[-4000:], file=sys.stderr)
        print(f"training failed with exit code {proc.returncode}", file=sys.stderr)
        return proc.returncode
    rows = read_metrics(ckpt)
    steps = [r for r in rows if r.get("event") == "step"]
    if steps and steps[-1]["step"] != shown:
        print("  " + progress_line(steps[-1], total))
    print(f"  finished in {time.monotonic() - t0:.0f}s")

    print("== 3/3 results")
    end: dict[str, Any] = next((r for r in reversed(rows) if r.get("event") == "end"), {})
    if "testAccuracy" in end:
        print(f"  test accuracy {end['testAccuracy']:.3f} (test loss {end['testLoss']:.4f})")
    print(f"  checkpoints in {ckpt}:")
    for f in sorted(ckpt.iterdir()):
        print(f"    {f.name}")
    png = out / "loss.png"
    plot(rows, png)
    print(f"  loss curve: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
