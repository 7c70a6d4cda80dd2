"""``make demo``: the operator runs a real training job on a cluster of four machines here,
with live progress.

1/4 brings up the kind cluster of `make up` (:mod:`ddp_devcluster.kind.cluster`: one control
plane and three workers, podman's provider, the node image assembled here), or reuses the one
that is up: the registry on this host, both images that `make images` built pushed there and
pulled by every machine, and the Helm chart with the operator image. 2/4 applies
``manifests/examples/checkpoint-pvc-shared.yaml`` (a ReadWriteMany claim every machine
mounts) and ``digits.yaml`` in the namespace ``ddp-demo``. 3/4 follows the DDPJob: one line
per change of its ``status.progress`` (as rank 0 reports it) and of its phase. 4/4 prints
``kubectl get ddpj digits`` and the machine of each pod, copies the checkpoint volume and the
pods' logs to ``--out`` (so they outlive the cluster), prints the test accuracy and draws the
loss curve. A cluster the demo made is deleted at the end (``--keep`` keeps it and the demo's
namespace, as `make up` would); one that was up already keeps running without that namespace.

Needs root (kind's node containers are privileged podman containers) and the container tools
from Debian's packages that `make host-packages` installs.
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

from ddp_api.contract import KIND
from ddp_api.ddpjob import TERMINAL_PHASES
from ddp_api.pods import LABEL_JOB
from ddp_client.curves import curves, draw_curves
from ddp_client.live import LiveView, outcome_line
from ddp_trainer.reporting.run_log import read_run_log

from .harness import Harness
from .kind import cluster as kind
from .kind.lock import InUse, hold
from .operator_process import REPO

JOB, CLAIM, NAMESPACE = "digits", "digits-checkpoints", "ddp-demo"
EXAMPLES = REPO / "manifests" / "examples"
EXAMPLE_FILES = ("checkpoint-pvc-shared.yaml", "digits.yaml")
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
        if d.get("kind") == KIND and d["metadata"]["name"] == JOB:
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


def pod_machines(pods: dict[str, dict[str, Any]]) -> list[str]:
    """``pod  machine`` lines, by pod name: where the scheduler put each pod of the job."""
    return [
        f"{name}  {p['spec'].get('nodeName') or '(not scheduled)'}"
        for name, p in sorted(pods.items())
    ]


# -- the demo -----------------------------------------------------------------------------
def header(text: str) -> None:
    print(f"== {text}", flush=True)


def indent(text: str) -> str:
    return "\n".join("  " + line for line in text.rstrip().splitlines())


def log(message: str) -> None:
    print("  " + message, flush=True)


def copy_logs(h: Harness, out: Path) -> list[Path]:
    """The job's container logs (``kubectl logs``) to ``out/<pod>.<container>.0.log``."""
    copied = []
    out.mkdir(parents=True, exist_ok=True)
    for pod, container in h.pod_containers():
        if pod.startswith(f"{JOB}-"):
            dest = out / f"{pod}.{container}.0.log"
            dest.write_text(h.logs(pod, container))
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
    ap.add_argument(
        "--keep",
        action="store_true",
        help="keep the cluster and the demo's namespace (`make down` removes them)",
    )
    args = ap.parse_args(argv)

    why = kind.requirements()
    if why:
        print(
            f"make demo runs the job on a kind cluster of four machines (podman containers) on "
            f"this machine, which cannot start here: {why}. Run it as root (e.g. `sudo make "
            "demo`) on Linux; `make demo` installs the container tools (podman, buildah, runc, "
            "CNI plugins) from apt.",
            file=sys.stderr,
        )
        return 2

    out = args.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t_start = time.monotonic()

    header("1/4 cluster up: kind (4 machines), a registry here, both images, helm install")
    try:
        release = hold(kind.NAME, "make demo", log=log)  # until the demo is done with it
    except InUse as e:
        print(f"make demo: {e}", file=sys.stderr)
        return 2
    before = kind.instance()
    h: Harness | None = None
    try:
        kubeconfig = kind.up(log=log)
        kind.install(kubeconfig, log=log)
        h = Harness(kubeconfig, NAMESPACE)
        print(f"  up in {time.monotonic() - t_start:.0f}s")
        print(indent(h.k("get", "nodes", ns="")), flush=True)
        problem = run(h, args.stall_timeout, out)
        if problem is not None:
            print(f"\nFAILED: {problem}\n{h.diagnostics()}", file=sys.stderr)
            return 1
    finally:
        ours = kind.instance() != before  # made, or made anew in place of a broken one
        if args.keep:
            print(f"  the cluster stays with the namespace {NAMESPACE} (`make down` removes it)")
        elif ours:
            print("  tearing down the cluster ...", flush=True)
            kind.down(log=log)
        elif h is not None:  # a cluster that was up before: only the demo's part goes
            print(f"  the cluster stays (`make down` removes it); namespace {NAMESPACE} deleted")
            h.k("delete", "namespace", NAMESPACE, "--wait=false", ns="", check=False)
        release()
    print(f"  done in {time.monotonic() - t_start:.0f}s")
    return 0


def run(h: Harness, stall_timeout_s: float, out: Path) -> str | None:
    """Steps 2 to 4 in the demo's namespace (made anew); what went wrong, or None."""
    h.k("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", ns="")
    h.k("create", "namespace", NAMESPACE, ns="")
    header(f"2/4 kubectl apply -n {NAMESPACE} -f manifests/examples/{{{','.join(EXAMPLE_FILES)}}}")
    print(
        f"  (the applied DDPJob gets spec.template.env DDPJOB_PROGRESS_INTERVAL_S="
        f"{PROGRESS_INTERVAL_S}: rank 0 reports progress every {PROGRESS_INTERVAL_S}s, not 10s)"
    )
    print(indent(h.apply(*example_documents())), flush=True)
    status = train(h, stall_timeout_s)
    if status is None:  # train() printed why: a Failed job, or a status that stopped moving
        return f"ddpjob/{JOB} did not succeed (above)"
    if status["phase"] != "Succeeded":
        return f"ddpjob/{JOB} {status}"
    return results(h, out) or None


def train(h: Harness, stall_timeout_s: float) -> dict[str, Any] | None:
    """Step 3: the job's progress as rank 0 reports it, until it ends; its last status (None:
    its status stopped moving for ``stall_timeout_s``)."""
    header(f"3/4 training: status.progress of ddpjob/{JOB}, as rank 0 reports it")
    view = LiveView(lambda s: print(s, end="", flush=True), tty=sys.stdout.isatty())
    t_job = time.monotonic()
    try:
        status = h.phase(JOB, TERMINAL_PHASES, stall_timeout_s, on_status=view)
    except (TimeoutError, AssertionError) as e:
        view.close()
        print(f"\n{e}", file=sys.stderr)
        return None
    view.close()
    print(f"  {outcome_line(JOB, status)}; watched for {time.monotonic() - t_job:.0f}s", flush=True)
    if view.lines == 0:
        said = [
            line.strip()
            for pod in h.workers(JOB)
            for line in h.logs(pod, "trainer").splitlines()
            if "progress" in line and "WARNING" in line
        ]
        print(
            "  WARNING: status.progress never arrived, so there was nothing to show"
            + "".join(f"\n    {x}" for x in said),
            flush=True,
        )
    return status


def results(h: Harness, out: Path) -> str:
    """Step 4: the checkpoints, logs and loss curve copied to ``out``; what is wrong with the
    checkpoints ("" when nothing)."""
    header("4/4 results")
    print(indent(h.k("get", "ddpj", JOB)))
    print("  the job's pods ran on these machines:")
    print(indent("\n".join(pod_machines(h.pods(f"{LABEL_JOB}={JOB}")))))
    ckpt = out / "checkpoints"
    shutil.copytree(kind.claim_folder(h, CLAIM), ckpt)
    logs = copy_logs(h, out / "logs")
    rows = read_run_log(ckpt)
    end = end_event(rows)
    if "testAccuracy" in end:
        print(f"  test accuracy {end['testAccuracy']:.3f} (test loss {end['testLoss']:.4f})")
    print(f"  checkpoints (the claim {CLAIM}, on every machine) copied to {ckpt}:")
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
