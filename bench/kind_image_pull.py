"""How the trainer image reaches the kind cluster's machines: the first pull, and the pull after
a code-only change. Prints one JSON object (its last line)::

    python bench/kind_image_pull.py

On the cluster of `make up`, made anew (left up afterwards):

1. ``first``: the trainer image pulled by all four new machines at once from the host
   registry: kubelet's own ``Pulled`` times, per machine. (Removing the image from a running
   machine's containerd is not enough: the layers stay while a container of it is
   remembered, and the pull then takes a tenth of a second.) Since the node image preloads
   the trainer's dependency layers (docs/kind.md), this first pull fetches and unpacks only
   the code layers too.
2. ``code change``: the trainer image is rebuilt from a copy of the checkout in which one file
   of ``trainer_image/ddp_trainer`` has one more line, exactly as `make images` builds it
   (buildah's layer cache keeps every layer but the code's); pushed (only the new layer is
   sent) and pulled by all four again.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ddp_devcluster import images
from ddp_devcluster.containers import podman
from ddp_devcluster.kind import cluster, registry

REPO = Path(__file__).resolve().parents[1]


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def nodes() -> list[str]:
    out = podman(
        "ps",
        "--format",
        "{{.Names}}",
        "--filter",
        f"label=io.x-k8s.kind.cluster={cluster.NAME}",
        check=True,
    ).stdout
    return sorted(out.split())


def forget(ref: str) -> None:
    """Removes ``ref`` from every machine's containerd; its unshared layers go with it."""
    for node in nodes():
        podman("exec", node, "ctr", "-n", "k8s.io", "images", "rm", "--sync", ref)


def code_changed_image(base_ref: str) -> str:
    """The trainer image of a checkout with one changed code file (a copy in a temp folder)."""
    ref = base_ref.rsplit(":", 1)[0] + ":bench-code-change"
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "repo"
        ignore = shutil.ignore_patterns(".git", "out", "*.egg-info", "__pycache__", ".*_cache")
        shutil.copytree(REPO, copy, ignore=ignore)
        changed = copy / "trainer_image" / "ddp_trainer" / "__init__.py"
        changed.write_text(changed.read_text() + f"# bench/kind_image_pull.py {time.time()}\n")
        build = next(
            b
            for b in images.builds({"operator": "x:y", "trainer": ref}, copy)
            if b.name == "trainer"
        )
        images.build_image(build, log, context=copy)
    return ref


def summary(pulls: dict[str, float | None]) -> dict[str, Any]:
    times = [t for t in pulls.values() if t is not None]
    return {
        "per_machine_s": pulls,
        "max_s": max(times) if times else None,
        "p50_s": statistics.median(times) if times else None,
    }


Pulls = dict[str, float | None]  # machine -> seconds of its pull (None: the image was there)


def push_and_pull(kubeconfig: Path, local_ref: str) -> tuple[str, float, Pulls, float]:
    """Pushes ``local_ref`` to the registry and pulls it onto every machine: (the remote ref,
    the push's seconds, each machine's pull, the pull's wall-clock seconds)."""
    t0 = time.monotonic()
    remote = registry.push(local_ref, log)
    push_s = time.monotonic() - t0
    t0 = time.monotonic()
    pulls = cluster.pull_everywhere(kubeconfig, remote, log)
    return remote, push_s, pulls, time.monotonic() - t0


def main() -> int:
    refs = images.ensure_images(("trainer",), log=log)
    cluster.down(log=log)
    kubeconfig = cluster.up(log=log)
    trainer = refs["trainer"]
    remote, push_s, first, first_wall = push_and_pull(kubeconfig, trainer)
    changed = code_changed_image(trainer)
    remote2, push2_s, second, second_wall = push_and_pull(kubeconfig, changed)
    forget(remote2)  # the bench's image goes; the real one stays on the machines
    podman("rmi", changed)

    sizes = images.sizes([trainer])
    result = {
        "image": remote,
        "image_bytes": sizes.get(trainer),
        "machines": len(first),
        "push_s": round(push_s, 1),
        "first_pull": summary(first),
        "first_pull_wall_s": round(first_wall, 1),
        "code_change_push_s": round(push2_s, 1),
        "code_change_pull": summary(second),
        "code_change_pull_wall_s": round(second_wall, 1),
        "first_pull_max_s": summary(first)["max_s"],
        "code_change_pull_max_s": summary(second)["max_s"],
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
