"""``kubectl ddp`` (installed from the built wheel) on real training runs: a script submitted
and watched to Succeeded with both ranks in its merged logs, one that raises watched to Failed
with its exception quoted (and one that does not compile failed at once), and the digits
example watched
(what it leaves: status, the final checkpoint, `kubectl get`'s columns), its logs read and its
loss and learning rate plotted from the checkpoint volume, and its logs read again from the
volume once its pods are deleted (with the image its status names; an image the cluster
cannot pull fails the read at once).

Logs come through the kubelets' pods/log (``kubectl logs``), as does the output of
``plot``'s reader pod.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from e2e_scenario import CLAIMS, Scenario

from ddp_api.pods import selector
from ddp_client import DDPClient
from ddp_client.loglines import parse_timestamp
from ddp_trainer.reporting.run_log import read_run_log
from kubectl_plugin import KubectlDdp

pytestmark = pytest.mark.e2e
STEPS = 5
# Every rank prints a line per step; the all-reduce keeps the ranks in step, and a second
# between steps keeps each step's lines apart in time, whatever the pipes' latency.
SCRIPT = f"""\
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
for step in range(1, {STEPS + 1}):
    x = torch.tensor([float(rank + 1)])
    dist.all_reduce(x)
    print(f"step {{step}}: rank {{rank}} of {{world}} sees sum {{x.item():.0f}}", flush=True)
    time.sleep(1.0)
dist.barrier()
dist.destroy_process_group()
"""
WATCH_TIMEOUT_S = "400"  # `watch` gives up (exit code 3) on a stuck job instead of hanging


def plugin(sc: Scenario, kubectl_ddp: KubectlDdp) -> KubectlDdp:
    return KubectlDdp(kubectl_ddp.bin_dir, sc.kubeconfig)


def watched(sc: Scenario, ddp: KubectlDdp, job: str) -> list[str]:
    """``kubectl ddp watch JOB`` to its end; its lines, once it exited 0."""
    out = ddp("watch", job, "-n", sc.ns, "--timeout", WATCH_TIMEOUT_S, timeout=600)
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}\n{sc.diagnostics()}"
    return out.stdout.splitlines()


def test_a_submitted_script_succeeds_and_both_ranks_show_in_its_merged_logs(
    sc: Scenario, kubectl_ddp: KubectlDdp, tmp_path: Path
) -> None:
    ddp = plugin(sc, kubectl_ddp)
    script = tmp_path / "allreduce.py"
    script.write_text(SCRIPT)
    submitted = ddp("submit", str(script), "-n", sc.ns, "--nodes", "2", "--nproc", "1")
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip()
    follow = ddp.start("logs", job, "-n", sc.ns, "--follow")  # from before its pods start
    lines = watched(sc, ddp, job)
    assert "phase Succeeded: all 2 nodes exited 0" in lines
    assert lines[-1].startswith(f"ddpjob {job} Succeeded in ")

    logs = ddp("logs", job, "-n", sc.ns, "--timestamps")
    assert logs.returncode == 0, logs.stderr
    rows = [line.split(" ", 2) for line in logs.stdout.splitlines()]  # time, [node-i, rest
    times = [parse_timestamp(t) for t, _, _ in rows]
    assert None not in times and times == sorted(times), "merged in time order"
    said = [(node, rest) for _, node, rest in rows if "sees sum" in rest]
    nodes_of: dict[int, set[str]] = {}
    for node, rest in said:
        rank = int(rest.split("]", 1)[0].removeprefix("rank"))
        assert rest.startswith(f"rank{rank}] step ") and f": rank {rank} of 2 sees sum 3" in rest
        nodes_of.setdefault(rank, set()).add(node)
    assert sorted(nodes_of) == [0, 1] and len(said) == 2 * STEPS
    assert {n for ns in nodes_of.values() for n in ns} == {"[node-0", "[node-1"}
    assert all(len(ns) == 1 for ns in nodes_of.values())  # a rank stays on its node
    steps = [int(rest.split("step ", 1)[1].split(":")[0]) for _, rest in said]
    assert steps == sorted(steps), "each step's lines before the next step's"

    followed, err = follow.communicate(timeout=120)  # it ends by itself with the job
    assert follow.returncode == 0, err
    seen = [line for line in followed.splitlines() if "sees sum" in line]
    # The same lines; their order may differ where one reached the API a second late.
    assert sorted(seen) == sorted(f"{node} {rest}" for node, rest in said)

    rank1 = ddp("logs", job, "-n", sc.ns, "--rank", "1").stdout.splitlines()
    assert len(rank1) == STEPS and all(" rank1] step " in line for line in rank1)


def test_a_submitted_script_that_raises_has_its_exception_quoted_in_the_jobs_status(
    sc: Scenario, kubectl_ddp: KubectlDdp, tmp_path: Path
) -> None:
    """``submit`` runs the script under the trainer image's node wrapper, which reads the first
    worker's exception out of torchrun's output: the pod's failure quotes it (the job has no
    checkpoint volume, so nothing of the log is kept: the words come from the relay), and
    `watch` shows them while the job restarts and when it fails."""
    ddp = plugin(sc, kubectl_ddp)
    script = tmp_path / "bad_corpus.py"
    script.write_text('raise ValueError("the corpus at /data/corpus.txt has no text")\n')
    typo = tmp_path / "typo.py"  # no restart can mend it: the job fails at once
    typo.write_text("import torch\nfor i in range(3)\n    print(i)\n")
    jobs = []
    for path in (script, typo):
        submitted = ddp("submit", str(path), "-n", sc.ns)
        assert submitted.returncode == 0, submitted.stderr
        jobs.append(submitted.stdout.strip())
    job, typo_job = jobs
    assert sc.get("ddpjob", job)["spec"]["command"] == ["python", "-m", "ddp_trainer.node"]

    out = ddp("watch", job, "-n", sc.ns, "--timeout", WATCH_TIMEOUT_S, timeout=600)
    assert out.returncode == 1, f"{out.stdout}\n{out.stderr}\n{sc.diagnostics()}"  # Failed
    print(out.stdout, flush=True)
    words = "ValueError: the corpus at /data/corpus.txt has no text"
    lines = out.stdout.splitlines()
    restarting = [line for line in lines if line.startswith("phase Restarting: ")]
    assert restarting, lines  # (a watch may miss a short Restarting between two reads)
    assert all(f"-node-0 failed with exit code 1: {words}; restart " in r for r in restarting)
    assert lines[-2].startswith("phase Failed: ") and words in lines[-2], lines
    assert lines[-1].startswith(f"ddpjob {job} Failed in ") and "BackoffLimitExceeded" in lines[-1]
    failed = next(c for c in sc.status(job)["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "BackoffLimitExceeded"
    assert failed["message"] == (
        f"{job}-node-0 failed with exit code 1: {words}; the job already used its backoffLimit"
        " of 3 restarts"
    )

    status = sc.phase(typo_job, "Failed", 60)
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert (failed["reason"], status["restarts"]) == ("SyntaxError", 0)
    assert failed["message"] == (
        f"{typo_job}-node-0 cannot run the program: it does not compile: SyntaxError: expected"
        " ':' (/scripts/typo.py, line 2); fix it and run the job again (no restart can)"
    )


def faster_progress(job: dict[str, Any]) -> None:
    """rank 0 reports status.progress every 2 s instead of 10 (as `make demo` does)."""
    env = job["spec"].setdefault("template", {}).setdefault("env", [])
    env.append({"name": "DDPJOB_PROGRESS_INTERVAL_S", "value": "2"})


def test_digits_watched_to_succeeded_then_its_loss_and_lr_plotted_from_its_volume(
    sc: Scenario, kubectl_ddp: KubectlDdp, tmp_path: Path
) -> None:
    ddp = plugin(sc, kubectl_ddp)
    sc.apply_example(CLAIMS, "digits.yaml", edit=faster_progress)
    lines = watched(sc, ddp, "digits")
    bars = [line for line in lines if line.startswith("[")]
    assert bars and "(world size 2)" in bars[-1]
    total = sc.progress("digits")["totalSteps"]
    assert bars[-1].startswith("[" + "#" * 30 + "]") and f"step {total}/{total}" in bars[-1]
    assert "phase Succeeded: all 2 nodes exited 0" in lines

    # What Succeeded left: status, the final checkpoint on the volume, kubectl get's columns.
    status = sc.status("digits")
    progress = status["progress"]
    assert progress["step"] == total and progress["worldSize"] == 2
    assert status.get("restarts", 0) == 0
    ckpt = sc.claim("digits-checkpoints")
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert (ckpt / manifest["latest"]).is_file()
    assert manifest["latest"] == f"step-{total:08d}.pt"
    assert progress["lastCheckpoint"].endswith(manifest["latest"])
    end = next(r for r in read_run_log(ckpt) if r.get("event") == "end")
    assert end["testAccuracy"] >= 0.85
    header, row = sc.k("get", "ddpj", "digits").splitlines()[:2]
    table = dict(zip(header.split(), row.split(), strict=False))
    assert table["PHASE"] == "Succeeded"
    assert int(table["EPOCH"]) == progress["epoch"] and int(table["STEP"]) == total
    assert float(table["LOSS"]) == pytest.approx(progress["loss"])

    logs = ddp("logs", "digits", "-n", sc.ns, "--rank", "0")
    assert logs.returncode == 0, logs.stderr
    last = f"ddp_trainer.trainer: step {total}/{total} epoch"  # the trainer's own log line
    (line,) = [line for line in logs.stdout.splitlines() if last in line]
    assert line.startswith("[node-") and " rank0] " in line

    png = tmp_path / "loss.png"
    plotted = ddp("plot", "digits", "-n", sc.ns, "-o", str(png))
    assert plotted.returncode == 0, f"{plotted.stderr}\n{sc.diagnostics()}"
    assert plotted.stdout.strip() == (
        f"{png}: training loss and learning rate of steps 1 to {total}"
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    client = DDPClient(sc.ns, kubeconfig=str(sc.kubeconfig))
    drawn = client.plot("digits", tmp_path / "again.png")
    assert drawn.lines == 2  # the loss and the learning rate
    steps = [s for s, _ in drawn.curves.loss]  # the trainer logs every logEverySteps
    assert steps[0] == 1 and steps[-1] == total and len(steps) > 2
    assert [s for s, _ in drawn.curves.lr] == steps
    assert drawn.curves.loss[-1][1] < drawn.curves.loss[0][1]  # it learned
    assert sc.k("get", "pods", "-l", "app.kubernetes.io/managed-by=kubectl-ddp", "-o", "name") == ""

    # Each node kept its log on the volume; once its pods are gone, `logs` reads those files,
    # and every node's lines are those its pod's log had, in the same order.
    kept = sorted(p.name for p in (ckpt / "logs").iterdir())
    assert kept == ["digits-node-0.log", "digits-node-1.log"], kept
    from_pods = ddp("logs", "digits", "-n", sc.ns)
    assert from_pods.returncode == 0 and from_pods.stderr == "", from_pods.stderr
    sc.k("delete", "pods", "-l", selector("digits"), "--wait=true")
    # No pod is left to name the image that the operator gave the job (its default, not in
    # the spec, and not the client's built-in default, which no machine here can pull): the
    # job's status names it.
    assert status["image"] == sc.s.refs["trainer"]
    from_volume = ddp("logs", "digits", "-n", sc.ns)
    assert from_volume.returncode == 0, f"{from_volume.stderr}\n{sc.diagnostics()}"
    assert "reading the logs its nodes kept on its volume" in from_volume.stderr

    def by_node(text: str) -> dict[str, list[str]]:
        nodes: dict[str, list[str]] = {}
        for line in text.splitlines():
            nodes.setdefault(line.split()[0].strip("[]"), []).append(line)
        return nodes

    assert by_node(from_volume.stdout) == by_node(from_pods.stdout)
    assert last in ddp("logs", "digits", "-n", sc.ns, "--rank", "0").stdout
    # An image the cluster cannot pull fails the read at once, naming the image and the fix.
    missing = sc.s.refs["trainer"].rsplit(":", 1)[0] + ":no-such-tag"
    refused = ddp("logs", "digits", "-n", sc.ns, "--image", missing)
    assert refused.returncode != 0 and f"cannot pull image {missing} (" in refused.stderr
    assert "name the job's image with --image" in refused.stderr
    assert sc.k("get", "pods", "-l", "app.kubernetes.io/managed-by=kubectl-ddp", "-o", "name") == ""
