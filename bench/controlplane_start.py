"""Warm start time of the embedded control plane, and the recorded cold build times.

Prints one JSON object. ``python bench/controlplane_start.py [--runs 3]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from ddp_devcluster.paths import cache_dir
from ddp_devcluster.plane import ControlPlane


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=2)
    args = ap.parse_args()
    starts, stops = [], []
    for i in range(args.runs):
        cp = ControlPlane(nodes=args.nodes, log=lambda _m: None)
        cp.start()
        t0 = time.monotonic()
        cp.stop()
        stops.append(time.monotonic() - t0)
        starts.append(cp.startup_s)
        print(f"run {i + 1}/{args.runs}: ready in {cp.startup_s:.1f}s", flush=True)
    record = cache_dir() / "bin" / "build-times.json"
    builds = json.loads(record.read_text()) if record.exists() else {}
    print(
        json.dumps(
            {
                "warm_start_s_median": round(statistics.median(starts), 2),
                "warm_start_s_max": round(max(starts), 2),
                "stop_s_median": round(statistics.median(stops), 2),
                "nodes": args.nodes,
                "runs": args.runs,
                "cold_build_s": builds,
                "cold_build_s_total": round(sum(builds.values()), 1),
            }
        )
    )


if __name__ == "__main__":
    main()
