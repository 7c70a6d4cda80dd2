"""``make demo``: the operator runs a real training job on this machine, with live progress.

1/4 starts a whole cluster here (:class:`~ddp_devcluster.stack.LocalStack`, ``chart=True``):
both images built by `make images`, the embedded control plane, one real node (kubelet,
containerd, runc, CNI, CoreDNS, kube-proxy, a volume provisioner) and the Helm chart with the
operator image. 2/4 applies ``manifests/examples/checkpoint-pvc.yaml`` and ``digits.yaml``.
3/4 follows the DDPJob: one line per change of its ``status.progress`` (as rank 0 reports it)
and of its phase. 4/4 prints ``kubectl get ddpj digits``, copies the checkpoint volume and the
pods' logs to ``--out`` (so they outlive the cluster), prints the test accuracy and draws the
loss curve; then everything is torn down.

Needs root (the node's namespaces, cgroups and mounts) and the container tools from Debian's
packages that `make host-packages` installs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from ddp_api.ddpjob import TERMINAL_PHASES
from ddp_client.curves import curves, draw_curves
from ddp_client.live import LiveView
from ddp_trainer.progress import read_run_log

from . import node
from .operator_process import REPO
from .stack import LocalStack

JOB, CLAIM, NAMESPACE = "digits", "digits-checkpoints", "default"
EXAMPLES = REPO / "manifests" / "examples"
EXAMPLE_FILES = ("checkpoint-pvc.yaml", "digits.yaml")
# The trainer reports status.progress at most every 10 s by default: a live view of a
# half-minute job wants it more often. Added to the applied object only (the file is as is).
PROGRESS_INTERVAL_S = "2"


# -- pure helpers (no I/O) --------------------------------------------------------------------
def example_documents(interval_s: str = PROGRESS_INTERVAL_S) -> list[dict[str, Any]]:
    """The objects of the example files, the digits DDPJob with one env var added."""
    docs: list[dict[str, Any]] = []
    for name in EXAMPLE_FILES:
        docs += [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]
    for d in docs:
        if d.get("kind") == "DDPJob" and d["metadata"]["name"] == JOB:
            template = d["spec"].setdefault("template", {})
            env = template.setdefault("env", [])
            env.append({"name": "DDPJOB_PROGRESS_INTERVAL_S", "value": interval_s})
    return docs


def end_event(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The trainer's ``end`` event (test loss and accuracy), or {}."""
    return next((r for r in reversed(rows) if r.get("event") == "end"), {})


def checkpoint_problem(rows: list[dict[str, Any]], manifest: dict[str, Any] | None) -> str:
    """Why the copied volume does not hold the last checkpoint the trainer logged ("" if it
    does)."""
    logged = [r["name"] for r in rows if r.get("event") == "checkpoint" and "name" in r]
    if not logged:
        return "the trainer logged no checkpoint"
    if manifest is None:
        return "the volume has no manifest.json"
    if manifest.get("latest") != logged[-1]:
        return (
            f"the volume's manifest.json says {manifest.get('latest')}, but the trainer last "
            f"wrote {logged[-1]}"
        )
    return ""


# -- the demo -----------------------------------------------------------------------------
def header(text: str) -> None:
    print(f"== {text}", flush=True)


def indent(text: str) -> str:
    return "\n".join("  " + line for line in text.rstrip().splitlines())


def copy_logs(stack: LocalStack, out: Path) -> list[Path]:
    """The job's container logs (``kubectl logs``) to ``out/<pod>.<container>.0.log``."""
    copied = []
    out.mkdir(parents=True, exist_ok=True)
    for pod, container in stack.pod_containers(ns=NAMESPACE):
        if pod.startswith(f"{JOB}-"):
            dest = out / f"{pod}.{container}.0.log"
            dest.write_text(stack.logs(pod, container, ns=NAMESPACE))
            copied.append(dest)
    return copied


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddp_devcluster demo", description=__doc__)
    ap.add_argument("--out", type=Path, default=Path("out/demo"), help="where results stay")
    ap.add_argument(
        "--stall-timeout",
        type=float,
        default=300,
        help="give up when the job's status has not moved for this many seconds",
    )
    args = ap.parse_args(argv)

    why = node.requirements()
    if why:
        print(
            f"make demo runs the job on a real node of this machine, which it cannot start "
            f"here: {why}. Run it as root (e.g. `sudo make demo`) on Linux; `make demo` "
            "installs the container tools (podman, buildah, runc, CNI plugins) from apt.",
            file=sys.stderr,
        )
        return 2

    out = args.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t_start = time.monotonic()

    header("1/4 cluster up: images, embedded control plane, a real node, helm install")
    stack = LocalStack(chart=True, log=lambda m: print("  " + m, flush=True))
    try:
        stack.start()
        print(f"  up in {time.monotonic() - t_start:.0f}s")
        print(indent(stack.kubectl("get", "nodes").stdout), flush=True)

        header(f"2/4 kubectl apply -f manifests/examples/{{{','.join(EXAMPLE_FILES)}}}")
        print(
            f"  (the applied DDPJob gets spec.template.env DDPJOB_PROGRESS_INTERVAL_S="
            f"{PROGRESS_INTERVAL_S}: rank 0 reports progress every {PROGRESS_INTERVAL_S}s, "
            "not 10s)"
        )
        applied = stack.kubectl(
            "apply", "-f", "-", input=yaml.safe_dump_all(example_documents(), sort_keys=False)
        )
        print(indent(applied.stdout), flush=True)

        status = train(stack, args.stall_timeout)
        if status is None or status["phase"] != "Succeeded":
            print(
                f"\nFAILED: ddpjob/{JOB} {status}\n{stack.diagnostics(NAMESPACE)}", file=sys.stderr
            )
            return 1
        problem = results(stack, out)
        if problem:
            print(f"\nFAILED: {problem}\n{stack.diagnostics(NAMESPACE)}", file=sys.stderr)
            return 1
    finally:
        print("  tearing down the cluster ...", flush=True)
        stack.stop()
    print(f"  done in {time.monotonic() - t_start:.0f}s")
    return 0


def train(stack: LocalStack, stall_timeout_s: float) -> dict[str, Any] | None:
    """Step 3: the job's progress as rank 0 reports it, until it ends; its last status (None:
    its status stopped moving for ``stall_timeout_s``)."""
    header(f"3/4 training: status.progress of ddpjob/{JOB}, as rank 0 reports it")
    view = LiveView(lambda s: print(s, end="", flush=True), tty=sys.stdout.isatty())
    t_job = time.monotonic()
    try:
        status = stack.phase(JOB, TERMINAL_PHASES, stall_timeout_s, ns=NAMESPACE, on_status=view)
    except TimeoutError as e:
        view.close()
        print(f"\n{e}", file=sys.stderr)
        return None
    view.close()
    print(f"  {status['phase']} in {time.monotonic() - t_job:.0f}s", flush=True)
    if view.lines == 0:
        said = [
            line.strip()
            for pod in (f"{JOB}-node-0", f"{JOB}-node-1")
            for line in stack.logs(pod, "trainer", ns=NAMESPACE).splitlines()
            if "progress" in line and "WARNING" in line
        ]
        print(
            "  WARNING: status.progress never arrived, so there was nothing to show"
            + "".join(f"\n    {x}" for x in said),
            flush=True,
        )
    return status


def results(stack: LocalStack, out: Path) -> str:
    """Step 4: the checkpoints, logs and loss curve copied to ``out``; what is wrong with the
    checkpoints ("" when nothing)."""
    header("4/4 results")
    print(indent(stack.kubectl("get", "ddpj", JOB).stdout))
    ckpt = out / "checkpoints"
    shutil.copytree(stack.claim_dir(CLAIM), ckpt)
    logs = copy_logs(stack, out / "logs")
    rows = read_run_log(ckpt)
    end = end_event(rows)
    if "testAccuracy" in end:
        print(f"  test accuracy {end['testAccuracy']:.3f} (test loss {end['testLoss']:.4f})")
    print(f"  checkpoints (the claim {CLAIM}) copied to {ckpt}:")
    for f in sorted(ckpt.iterdir()):
        print(f"    {f.name}")
    print(f"  pod logs: {len(logs)} files in {out / 'logs'}")
    manifest_file = ckpt / "manifest.json"
    manifest = json.loads(manifest_file.read_text()) if manifest_file.exists() else None
    problem = checkpoint_problem(rows, manifest)
    if problem:
        return problem
    png = out / "loss.png"
    loss_only = dataclasses.replace(curves(rows), lr=[])
    title = f"DDPJob {JOB}: 2 pods, 1 process each (gloo), from its metrics.jsonl"
    draw_curves(loss_only, png, title=title)
    print(f"  loss curve: {png}", flush=True)
    return ""


if __name__ == "__main__":
    sys.exit(main())
