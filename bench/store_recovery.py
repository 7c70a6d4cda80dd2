"""How long a job takes to train again after its rendezvous store pod is deleted.

Runs on the end-to-end stack (``KindStack``: the kind cluster of four machines, torchrun in the
trainer image's containers, the operator as a process here; needs root; the cluster stays
for `make down`). Prints one JSON object and writes a PNG::

    python bench/store_recovery.py [--rounds 3] [--plot out/store_recovery.png]

Each round applies ``manifests/examples/digits.yaml`` in a fresh namespace, held after step 25
(``spec.trainer.holdAtSteps``, logging every step), deletes the pod ``digits-rdzv``, and reads
from ``metrics.jsonl`` and the API:

- ``store_running_s``: deletion until the operator's new store pod is Running;
- ``store_listening_s``: deletion until the new store process listens (its log line's
  timestamp: the store's Python and torch imports);
- ``resumed_s``: deletion until rank 0's resumed run started (torchrun restarted by
  ``ddp_trainer.node``, rendezvous on the new store, checkpoint loaded);
- ``recovery_s``: deletion until the first step completed after the resume (target < 15 s).

The job is held while the store goes, so every step after the deletion is a resumed one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from ddp_devcluster.harness import EXAMPLES
from ddp_devcluster.kind.stack import KindStack
from ddp_devcluster.polling import until
from ddp_trainer.reporting.run_log import read_run_log

HOLD = 25


def one_round(stack: KindStack) -> dict[str, float]:
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    stack.kubectl("create", "namespace", ns)
    docs = [
        d
        for f in ("checkpoint-pvc-shared.yaml", "digits.yaml")
        for d in yaml.safe_load_all((EXAMPLES / f).read_text())
        if d
    ]
    for d in docs:
        if d["kind"] == "DDPJob":
            d["spec"]["trainer"].update({"holdAtSteps": [HOLD], "logEverySteps": 1})
    stack.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all(docs))
    ckpt = stack.claim_dir("digits-checkpoints", ns=ns)
    until(
        f"digits held after step {HOLD}",
        lambda: (
            (stack.job("digits", ns=ns).get("status") or {}).get("progress", {}).get("heldAtStep")
            == HOLD
        ),
        timeout_s=300,
    )
    old = json.loads(stack.kubectl("get", "pod", "digits-rdzv", "-n", ns, "-o", "json").stdout)
    deleted = time.time()
    stack.kubectl("delete", "pod", "digits-rdzv", "-n", ns, "--wait=false")

    def new_store() -> float | None:
        out = stack.kubectl("get", "pod", "digits-rdzv", "-n", ns, "-o", "json", check=False)
        if out.returncode != 0:
            return None
        pod: dict[str, Any] = json.loads(out.stdout)
        if pod["metadata"]["uid"] == old["metadata"]["uid"]:
            return None
        return time.time() if pod["status"].get("phase") == "Running" else None

    store_running = until("the new store pod Running", new_store, timeout_s=120, interval_s=0.1)

    def first_step_after_resume() -> tuple[float, float] | None:
        rows = read_run_log(ckpt)
        starts = [r for r in rows if r["event"] == "start" and r.get("resumedFrom")]
        if not starts:
            return None
        after = [r for r in rows if r["event"] == "step" and r["time"] > starts[-1]["time"]]
        return (starts[-1]["time"], after[0]["time"]) if after else None

    resumed, stepped = until("a step after the resume", first_step_after_resume, timeout_s=300)
    store_log = stack.kubectl("logs", "--timestamps", "digits-rdzv", "-n", ns).stdout
    listening = store_listening(store_log)
    stack.kubectl("delete", "namespace", ns, "--wait=false")
    return {
        "store_running_s": round(store_running - deleted, 2),
        "store_listening_s": round(listening - deleted, 2),
        "resumed_s": round(resumed - deleted, 2),
        "recovery_s": round(stepped - deleted, 2),
    }


def store_listening(log: str) -> float:
    """When the store said it listens: the kubelet's timestamp on that line (this host's clock)."""
    for line in log.splitlines():
        if "rendezvous store listening" in line:
            return datetime.fromisoformat(line.split()[0]).timestamp()  # RFC 3339, UTC
    raise AssertionError(f"the new store never said it listens:\n{log}")


def plot(rounds: list[dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 1.3 + 0.5 * len(rounds)))
    for i, r in enumerate(rounds):
        spans = [
            (0, r["store_running_s"], "new store pod Running", "#8fb3d9"),
            (r["store_running_s"], r["store_listening_s"], "store process starts", "#c9a0dc"),
            (r["store_listening_s"], r["resumed_s"], "torchrun, rendezvous, resume", "#f2b36f"),
            (r["resumed_s"], r["recovery_s"], "first step", "#7bbf7b"),
        ]
        for start, end, label, color in spans:
            ax.barh(i, max(end - start, 0), left=start, color=color, label=label if i == 0 else "")
    ax.axvline(15, color="red", linestyle="--", label="target 15 s")
    ax.set_yticks(range(len(rounds)), [f"round {i + 1}" for i in range(len(rounds))])
    ax.set_xlabel("seconds after `kubectl delete pod digits-rdzv`")
    ax.set_title("Store pod deleted mid-run: time until training goes on")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=2, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--plot", type=Path, default=Path("out/store_recovery.png"))
    args = ap.parse_args()
    with KindStack(log=lambda m: print(f"[stack] {m}", file=sys.stderr)) as stack:
        rounds = []
        for i in range(args.rounds):
            rounds.append(one_round(stack))
            print(f"round {i + 1}/{args.rounds}: {rounds[-1]}", file=sys.stderr)
    plot(rounds, args.plot)
    summary: dict[str, Any] = {
        key + "_p50": statistics.median(r[key] for r in rounds)
        for key in ("store_running_s", "store_listening_s", "resumed_s", "recovery_s")
    }
    summary["recovery_s_max"] = max(r["recovery_s"] for r in rounds)
    summary["rounds"] = rounds
    summary["plot"] = str(args.plot)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
