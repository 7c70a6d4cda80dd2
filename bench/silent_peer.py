"""How long the survivor of an elastic job waits when its peer goes silent mid-training, or
while the run starts (``--at start``).

    python bench/silent_peer.py [--rdzv-conf CONF] [--pg-timeout-s S] [--step-timeout-s S]
        [--nnodes 1:2] [--replace-after-s S] [--at step|start [--lost-rank R]] [--label NAME]

A machine that vanishes (power off, partition) sends nothing: no FIN, no RST; its processes
just stop answering. Here: two torchrun nodes (``--nnodes=1:2``, one worker each, ``digits``)
against a dedicated rendezvous store on loopback, held after step 30 (``holdAtSteps``); then
one node, agent and worker, is frozen with SIGSTOP and the hold released. The frozen node is
SIGKILLed only once the survivor trains again (or the bench gives up). ``--nnodes 2:2``: a job
that is not elastic, whose survivor can only go on with the operator's replacement pod, a third
node started ``--replace-after-s`` after the SIGSTOP. ``--at start``: no hold; the first process
of rank ``--lost-rank`` (1) waits while it builds its workload (``padded_workload:wait_in_build``,
the spirals plugin, 6 steps), its peer waits for it in the model's broadcast, and its node is
frozen there. Prints one JSON object:

- ``survivor_worker_exit_s``: SIGSTOP until the survivor's worker process ended (its blocked
  collective timed out, or its agent stopped it);
- ``resumed_s``: SIGSTOP until rank 0's run started again (re-rendezvous, checkpoint loaded);
- ``next_step_s``: SIGSTOP until the first training step after it (``next_step_world_size``);
- ``finished``: whether the survivor then trained to the end and exited 0.

Defaults: the operator's ``PET_RDZV_CONF`` (``ddp_operator.render.RDZV_CONF``) and the trainer's
default ``pgTimeoutS`` and ``stepTimeoutS``, i.e. what a pod of the operator runs.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import repo_paths

repo_paths.add("tests/trainer")

from padded_workload import six_steps  # noqa: E402
from trainer_harness import Launcher, events, node_of, wait_until  # noqa: E402

from ddp_api.trainer_config import TrainerConfig  # noqa: E402
from ddp_devcluster.procs import descendants  # noqa: E402
from ddp_devcluster.recipes import digits  # noqa: E402
from ddp_operator.render import RDZV_CONF  # noqa: E402
from ddp_trainer.hold import release  # noqa: E402

HOLD = 30


def measure(
    rdzv_conf: str,
    pg_timeout_s: int | None,
    step_timeout_s: int | None,
    give_up_s: float,
    nnodes: str = "1:2",
    replace_after_s: float | None = None,
    workdir: Path | None = None,
    lost_rank: int | None = None,
) -> dict[str, Any]:
    """``lost_rank`` None: the silent peer mid-training; else that rank's node, at the start."""
    at_start = lost_rank is not None
    settings = (
        six_steps("padded_workload:wait_in_build")  # BUILD_RANK's first process waits there
        if at_start
        else digits(epochs=3, checkpointEverySteps=25, logEverySteps=5, holdAtSteps=[HOLD])
    )
    if pg_timeout_s is not None:
        settings["pgTimeoutS"] = pg_timeout_s
    if step_timeout_s is not None:
        settings["stepTimeoutS"] = step_timeout_s
    with tempfile.TemporaryDirectory(prefix="silent-peer-") as tmp:
        launcher = Launcher(workdir or Path(tmp))
        try:
            ckpt, marker = launcher.workdir / "ckpt", launcher.workdir / "building"
            _, endpoint = launcher.store()
            building = {"BUILD_RANK": str(lost_rank), "BUILD_MARKER": str(marker)}
            node = partial(
                launcher.node,
                endpoint=endpoint,
                nnodes=nnodes,
                nproc=1,
                settings=settings,
                checkpoint_dir=ckpt,
                is_host=False,
                rdzv_conf=rdzv_conf,
                extra_env=building if at_start else None,
            )
            silent, survivor = node("silent"), node("survivor")
            if at_start:
                if node_of(marker, [silent, survivor], 300, "the build") is survivor:
                    silent, survivor = survivor, silent
            else:
                wait_until(lambda: events(ckpt, "hold"), 300, f"the hold after step {HOLD}")
            workers = set(descendants(survivor.popen.pid))
            stopped = time.time()
            silent.freeze_tree()
            if not at_start:
                release(ckpt, HOLD)
            worker_exit: float | None = None
            replaced: float | None = None
            deadline = time.monotonic() + give_up_s
            first_step: dict[str, Any] | None = None
            while time.monotonic() < deadline:
                if worker_exit is None and not workers <= set(descendants(survivor.popen.pid)):
                    worker_exit = time.time()
                due = replace_after_s is not None and time.time() - stopped >= replace_after_s
                if due and replaced is None:
                    replaced = time.time()
                    node("replacement")
                after = [s for s in events(ckpt, "step") if s["time"] > stopped]
                if after:
                    first_step = after[0]
                    break
                time.sleep(0.1)
            silent.kill_tree()
            code = survivor.popen.wait(300) if first_step else None
            resumed = [s for s in events(ckpt, "start") if s["time"] > stopped]
            ends = events(ckpt, "end")
            return {
                "survivor_worker_exit_s": round(worker_exit - stopped, 1) if worker_exit else None,
                "resumed_s": round(resumed[0]["time"] - stopped, 1) if resumed else None,
                "resumed_from_step": resumed[0]["step"] if resumed else None,
                "next_step_s": round(first_step["time"] - stopped, 1) if first_step else None,
                "next_step_world_size": first_step["worldSize"] if first_step else None,
                "replacement_started_s": round(replaced - stopped, 1) if replaced else None,
                "gave_up_after_s": None if first_step else give_up_s,
                "finished": code == 0 and bool(ends),
            }
        finally:
            launcher.kill_all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rdzv-conf", default=RDZV_CONF)
    parser.add_argument("--pg-timeout-s", type=int, default=None)
    parser.add_argument("--step-timeout-s", type=int, default=None)
    parser.add_argument("--give-up-s", type=float, default=2400.0)
    parser.add_argument("--label", default="")
    parser.add_argument("--nnodes", default="1:2", help="2:2: a job that is not elastic")
    parser.add_argument(
        "--replace-after-s",
        type=float,
        default=None,
        help="start a third node (the operator's replacement pod) this long after the SIGSTOP",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="keep the logs there")
    parser.add_argument("--at", choices=("step", "start"), default="step")
    parser.add_argument("--lost-rank", type=int, default=1, help="--at start: whose node")
    args = parser.parse_args()
    defaults = TrainerConfig.model_validate({})
    result = {
        "label": args.label,
        "rdzv_conf": args.rdzv_conf,
        "pg_timeout_s": defaults.pg_timeout_s if args.pg_timeout_s is None else args.pg_timeout_s,
        "step_timeout_s": (
            defaults.step_timeout_s if args.step_timeout_s is None else args.step_timeout_s
        ),
        "nnodes": args.nnodes,
        "at": args.at,
        "lost_rank": args.lost_rank if args.at == "start" else None,
        **measure(
            args.rdzv_conf,
            args.pg_timeout_s,
            args.step_timeout_s,
            args.give_up_s,
            args.nnodes,
            args.replace_after_s,
            args.workdir,
            args.lost_rank if args.at == "start" else None,
        ),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
