"""`make demo`, the README's first command, trains for real and leaves what it promises."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_demo_trains_digits_to_the_accuracy_target(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            str(REPO / d) for d in ("operator", "trainer_image", "devcluster")
        ),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "ddp_devcluster", "demo", "--out", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=480,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ckpt = tmp_path / "checkpoints"
    rows = [json.loads(x) for x in (ckpt / "metrics.jsonl").read_text().splitlines()]
    end = next(r for r in rows if r.get("event") == "end")
    assert end["testAccuracy"] >= 0.95
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert (ckpt / manifest["latest"]).is_file()
    assert manifest["latest"] == f"step-{end['step']:08d}.pt"
    assert (tmp_path / "loss.png").stat().st_size > 1000
    assert "kwok-node-0   Ready" in proc.stdout
    assert "test accuracy" in proc.stdout and "loss curve:" in proc.stdout
