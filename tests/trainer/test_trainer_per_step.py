"""PerStep mode on loopback, in one run (a real lighthouse, replica groups as pods): a late group
heals from a live peer; a loop of SIGKILLs of random groups at chosen phases, each group started
again at once, crashes no survivor; a fourth group joins and one leaves on SIGTERM without any
other restarting; and the committed steps used exactly Restart mode's samples, each step's whole
global batch once. Apart: groups of two processes each (and one whose heal completed on one
rank only), a new lighthouse that stalls no group for long, groups that join while the only live
one is mid-step, fp16 groups whose GradScalers step alike and only on committed steps (on the
CPU), a healed group that fails a streak of non-finite steps together with its peers, a writer
lost after the others committed, a suspended job whose writer saves the step training stopped
at, a group resumed while the old writer still saves, a SIGTERM checkpoint slower than
torchrun's own 30 s wait, and with minGroups 2 a group lost at the last quorum and one too late.
``DDPJOB_TEST_KILLS=<n>`` makes the kill loop a soak."""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch
from replica_groups import (
    LIGHTHOUSE,
    Warm,
    Zygote,
    committed_step,
    group_env,
    lighthouse,
    pod,
    sample_lines,
    scaler_by_step,
    steps_committed,
    trained_together,
)
from torch.utils.data import TensorDataset
from trainer_harness import Launcher, Proc, checkpoint_files, events, wait_until

from ddp_api import contract
from ddp_api.ddpjob import DDPJob
from ddp_devcluster.procs import free_port
from ddp_operator import render
from ddp_trainer.data.batching import Position, batch_share
from ddp_trainer.data.loader import StepBatches
from ddp_trainer.state.store import CheckpointStore, read_completion

KILLS = int(os.environ.get("DDPJOB_TEST_KILLS", "50"))
SPACING = 2  # committed steps between two kills
JOIN_AT = 6  # the late group starts once this many steps are committed
# Until the kill loop ends, each group starts a step at most every STEP_S (below the
# lighthouse's 0.3 s join timeout), so that a kill costs about as many steps on any machine:
# paced, 50 kills took 32 s and 90 steps here; unpaced, two cores trained 40 steps a second, a
# kill cost 14 steps, and the run ended before the loop did.
STEP_S = 0.2
TOTAL = 40 + KILLS * 4 + 80
SAMPLES = 1438  # digits' training set
BATCH = 48
SETTINGS = {
    "workload": "digits",
    "epochs": 1000,
    "maxSteps": TOTAL,
    "globalBatchSize": BATCH,
    "amp": "auto",  # bf16 autocast on CPU
    "logEverySteps": 10,
    "checkpointEverySteps": 40,
    "checkpointKeep": 2,
    "evaluate": False,
}
GROUP_TIMEOUT_S = 2.0
PHASES = ["any", "quorum", "forward", "allreduce", "commit", "serve", "heal"]


def restart_mode_batch(step: int, total: int = TOTAL) -> list[int]:
    """Step ``step``'s global batch as Restart mode's loader gives it (a world of one): the
    samples of a dataset whose sample i is i."""
    ids = torch.arange(SAMPLES)
    loader = StepBatches(
        TensorDataset(ids, ids), batch_share(BATCH, 1, 0), 0, Position(0, 0, 0), total
    )
    return [int(i) for inputs, _ in loader[step] for i in inputs]


class Groups:
    """The run's groups: which incarnation of each is current, and what happened to each."""

    def __init__(
        self,
        launcher: Launcher,
        zygote: Zygote,
        url: str,
        ckpt: Path,
        samples: Path,
        settings: dict[str, Any] = SETTINGS,
    ):
        self.launcher, self.zygote, self.url = launcher, zygote, url
        self.settings = settings
        self.ckpt, self.samples = ckpt, samples
        self.current: dict[int, Proc | Warm] = {}
        self.stop_files: dict[int, Path] = {}
        self.ended_by_us: set[int] = set()  # ids of incarnations killed or stopped by the test
        self.started: dict[int, float] = {}
        self.count = 0
        self.kills = 0
        self.pace = launcher.workdir / "pace"  # STEP_S until the kill loop ends
        self.pace.write_text(str(STEP_S))

    def env(self, group: int, groups: int, stop_at: str | None = None) -> dict[str, str]:
        env = group_env(
            group, self.url, groups=groups, timeout_s=GROUP_TIMEOUT_S, samples=self.samples
        )
        self.count += 1
        stop = self.launcher.workdir / f"stop-{group}-{self.count}"
        if stop_at:
            stop.write_text(stop_at)
        self.stop_files[group] = stop
        # a step at most every STEP_S while the pace file says so (DDPJOB_TEST_STEP_S)
        return {**env, "DDPJOB_TEST_STOP_AT": str(stop), "DDPJOB_TEST_STEP_S": str(self.pace)}

    def start_pod(self, group: int, groups: int = 3, stop_at: str | None = None) -> Proc:
        env = self.env(group, groups, stop_at)
        proc = pod(
            self.launcher,
            f"pod-{group}-{self.count}",
            env=env,
            settings=self.settings,
            checkpoint_dir=self.ckpt,
        )
        self.current[group] = proc
        self.started[id(proc)] = time.time()
        return proc

    def start_warm(self, group: int, stop_at: str | None = None) -> Warm:
        env = self.env(group, 3, stop_at)
        warm = self.zygote.fork(
            f"warm-{group}-{self.count}", env=env, settings=self.settings, checkpoint_dir=self.ckpt
        )
        self.current[group] = warm
        self.started[id(warm)] = time.time()
        return warm

    def pid(self, group: int) -> int:
        member = self.current[group]
        return member.popen.pid if isinstance(member, Proc) else member.pid

    def wait_for_live(self, count: int, timeout: float) -> list[int]:
        """The live groups among the first three once ``count`` are live ([] past
        ``timeout``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            live = [g for g in self.live() if g < 3]
            if len(live) >= count:
                return live
            time.sleep(0.05)
        return []

    def release(self, group: int) -> None:
        """Lets a group started with ``stop_at="start"`` join."""
        self.stop_files[group].write_text("go")

    def live(self) -> list[int]:
        """Groups whose current incarnation has committed a step."""
        committed = {r["file"] for r in sample_lines(self.samples) if r["event"] == "committed"}
        pids = {int(name.rsplit("-", 1)[1].split(".")[0]) for name in committed}
        return [g for g in self.current if self._worker_pid(g) in pids]

    def _worker_pid(self, group: int) -> int | None:
        member = self.current[group]
        if isinstance(member, Warm):
            return member.pid
        found = re.search(r"replica group \S+ \(local rank 0 of \d+, pid (\d+)\)", member.output())
        return int(found.group(1)) if found else None  # a pod's worker names itself in its log

    def kill(self, group: int) -> None:
        member = self.current[group]
        self.ended_by_us.add(id(member))
        if isinstance(member, Proc):
            member.kill_tree()
        else:
            self.zygote.kill(member)
        self.kills += 1

    def reached(self, group: int, timeout: float) -> bool:
        marker = Path(f"{self.stop_files[group]}.reached")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if marker.exists():
                return True
            time.sleep(0.01)
        return False

    def wait_ended(self, which: tuple[int, ...] | range, timeout: float) -> None:
        """Waits for the current incarnation of each group in ``which`` to end."""
        for group in which:
            member = self.current[group]
            wait_until(lambda m=member: self.code(m) is not None, timeout, f"group {group} to end")

    def hold(self, group: int, phase: str) -> None:
        """Holds a group at ``phase`` of the step it is on, once it gets there (waited for)."""
        self.stop_files[group].write_text(phase)
        assert self.reached(group, 30), f"group {group} never reached {phase}"

    def disarm(self, group: int) -> None:
        self.stop_files[group].unlink(missing_ok=True)

    def code(self, member: Proc | Warm) -> int | None:
        return member.popen.poll() if isinstance(member, Proc) else member.code

    def all_members(self) -> list[Proc | Warm]:
        warm = list(self.zygote.groups.values())
        return [p for p in self.launcher.procs if p.name.startswith("pod-")] + warm

    def crashed(self) -> list[str]:
        """Incarnations that ended on their own with a non-zero code."""
        out = []
        for member in self.all_members():
            code = self.code(member)
            if code not in (None, 0) and id(member) not in self.ended_by_us:
                out.append(f"{member.name} exited {code}\n{member.output()[-3000:]}")
        return out


def three_groups_past_step_10(
    launcher: Launcher, tmp_path: Path, settings: dict[str, Any]
) -> tuple[Groups, Zygote, Path, Path]:
    """A lighthouse and three warm groups, returned once all three train past step 10: the
    groups, their zygote (the caller closes it), the checkpoint and sample-log folders."""
    ckpt, samples = tmp_path / "ckpt", tmp_path / "samples"
    _, url = lighthouse(launcher, heartbeat_ms=1000, join_ms=300)
    zygote = Zygote.start(launcher)
    groups = Groups(launcher, zygote, url, ckpt, samples, settings)
    try:
        for group in range(3):
            groups.start_warm(group)
        wait_until(
            lambda: len(groups.live()) == 3 and committed_step(samples) >= 10,
            180,
            "three groups past step 10",
        )
    except BaseException:
        zygote.close()
        raise
    return groups, zygote, ckpt, samples


def kill_loop(groups: Groups, rng: random.Random) -> Counter[str]:
    """KILLS SIGKILLs of random live groups at random phases, each group started again at
    once; at least one group always lives. Returns the kills by phase."""
    by_phase: Counter[str] = Counter()
    last = committed_step(groups.samples)
    while groups.kills < KILLS:
        assert not groups.crashed(), groups.crashed()
        live = groups.wait_for_live(2, 120)
        assert live, "two live groups"
        assert committed_step(groups.samples) < TOTAL - 40, "too few steps for the kills"
        target = last + SPACING
        wait_until(lambda t=target: committed_step(groups.samples) >= t, 120, "training to go on")
        victim, phase = rng.choice(live), rng.choice(PHASES)
        if phase == "serve":  # a source, a joiner and a survivor: three live groups
            live = groups.wait_for_live(3, 20) or live
        if phase == "heal":  # killed while it heals: the new incarnation stops at the heal
            groups.kill(victim)
            groups.start_warm(victim, stop_at="heal")
            by_phase["any"] += 1
            if groups.reached(victim, 20):
                by_phase["heal"] += 1
            groups.kill(victim)
        elif phase == "serve" and len(live) >= 3:  # a heal source dies mid-transfer: a
            # group joins and heals from the first up-to-date group by replica id (torchft's
            # choice), the victim, which stops while serving it
            other = rng.choice(live)
            victim = min(g for g in live if g != other)
            groups.stop_files[victim].write_text("serve")
            groups.kill(other)
            groups.start_warm(other)
            by_phase["any"] += 1
            if groups.reached(victim, 10):
                by_phase["serve"] += 1
            else:
                groups.disarm(victim)
            groups.kill(victim)
        elif phase in ("any", "serve"):
            time.sleep(rng.uniform(0, 0.2))
            groups.kill(victim)
            by_phase["any"] += 1
        else:
            groups.stop_files[victim].write_text(phase)
            by_phase[phase if groups.reached(victim, 10) else "any"] += 1
            groups.kill(victim)
        groups.start_warm(victim)
        last = committed_step(groups.samples)
    return by_phase


def check_exactly_once(samples: Path, total: int = TOTAL, nproc: int = 1) -> dict[str, Any]:
    """Each step's lineage (its last committing quorum) fed exactly Restart mode's global batch,
    split over all its participants; returns the redone steps and the survivors' stalls."""
    rows = sample_lines(samples)
    committing: dict[int, int] = {}
    fed: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    tried: set[tuple[int, int]] = set()
    commits_by_file: dict[str, list[float]] = defaultdict(list)
    paced: dict[str, list[tuple[float, float]]] = defaultdict(list)  # (time, seconds waited)
    for row in rows:
        if row["event"] == "paced":  # slept for the test's pace (DDPJOB_TEST_STEP_S): no stall
            paced[row["file"]].append((row["time"], row["waited_s"]))
            continue
        key = (row["step"], row["quorum"])
        if row["event"] == "committed":
            committing[row["step"]] = max(committing.get(row["step"], -1), row["quorum"])
            commits_by_file[row["file"]].append(row["time"])
        else:
            fed[key].append(row)
            tried.add(key)
    assert sorted(committing) == list(range(total)), "steps never committed"
    for step, quorum in committing.items():
        shares = fed[(step, quorum)]
        groups = {row["groups"] for row in shares}
        assert len(groups) == 1, (step, quorum, shares)
        ranks = list(range(groups.pop() * nproc))
        assert sorted(row["rank"] for row in shares) == ranks, (step, shares)
        seen = sorted(i for row in shares for i in row["indices"])
        assert seen == sorted(restart_mode_batch(step, total)), f"step {step} fed other samples"
    gaps = [
        b - a - sum(w for t, w in paced[file] if a < t <= b)
        for file, times in commits_by_file.items()
        for a, b in itertools.pairwise(times)
    ]
    redone = len({k for k in tried if committing.get(k[0]) != k[1]})
    return {
        "redone_tries": redone,
        "stall_max_s": round(max(gaps), 2),
        "stall_p50_s": round(statistics.median(gaps), 3),
    }


@pytest.mark.timeout(600)
def test_groups_heal_survive_kills_scale_and_use_each_sample_once(
    launcher: Launcher, tmp_path: Path
) -> None:
    began = time.monotonic()
    ckpt, samples = tmp_path / "ckpt", tmp_path / "samples"
    _, url = lighthouse(launcher, heartbeat_ms=1000, join_ms=300)
    zygote = Zygote.start(launcher)
    groups = Groups(launcher, zygote, url, ckpt, samples)
    try:
        groups.start_pod(0)
        groups.start_pod(1)
        # Started now, joining later: a pod's start takes ~20 s on two busy cores.
        late = groups.start_pod(2, stop_at="start")
        fourth = groups.start_pod(3, groups=4, stop_at="start")
        # (b) a late group heals from a live peer and trains from the step it joined at on
        wait_until(lambda: committed_step(samples) >= JOIN_AT, 240, f"step {JOIN_AT}")
        groups.release(2)
        joined_at = committed_step(samples)
        wait_until(lambda: 2 in groups.live(), 120, "the late group's first step")
        late_log = late.output()
        assert "healed from a live peer" in late_log and "resumed from checkpoint" not in late_log
        assert "INFO torchft_commits" not in late_log  # torchft's empty line for every commit
        assert "buffer is not writable" not in late_log  # torch's warning at every heal
        late_steps = [step - 1 for step in steps_committed(samples, by="job-2-")]
        assert min(late_steps) >= joined_at > 1, (joined_at, late_steps)
        started_kills = time.monotonic()
        print(f"late join at step {joined_at}: {time.monotonic() - began:.1f}s")

        # (a) the kill loop
        by_phase = kill_loop(groups, random.Random(37))
        groups.pace.unlink()  # the rest of the run at the machine's speed
        kill_s = time.monotonic() - started_kills
        print(
            f"{groups.kills} kills in {kill_s:.1f}s, by step {committed_step(samples)} of"
            f" {TOTAL}: {dict(by_phase)}"
        )

        # (c) a fourth group joins; then one group leaves on SIGTERM
        groups.release(3)
        wait_until(lambda: 3 in groups.live(), 120, "the fourth group's first step")
        wait_until(
            lambda: any(r.get("groups") == 4 for r in sample_lines(samples)), 120, "4 groups"
        )
        leaving = groups.current[1]
        groups.ended_by_us.add(id(leaving))
        if isinstance(leaving, Warm):
            os.killpg(leaving.pid, signal.SIGTERM)
        else:
            leaving.signal(signal.SIGTERM)
        wait_until(lambda: groups.code(leaving) is not None, 60, "the SIGTERMed group to leave")
        assert groups.code(leaving) == 143 or isinstance(leaving, Proc), groups.code(leaving)

        # the end: every group that is left finishes
        groups.wait_ended((0, 2, 3), 240)
        assert not groups.crashed(), "\n".join(groups.crashed())
        assert fourth.popen.returncode == 0
        for group in (0, 2, 3):
            assert groups.code(groups.current[group]) == 0, groups.current[group].output()[-3000:]
        # Every group's log, the killed ones' too: the peers' losses each lived through show
        # as one line each (torchft's errors without their tracebacks), never a traceback.
        logs = [p for p in launcher.workdir.glob("*.log") if not p.name.startswith("lighthouse")]
        assert len(logs) > KILLS
        tracebacks = [p.name for p in logs if "Traceback" in p.read_text(errors="replace")]
        assert tracebacks == [], tracebacks
    finally:
        zygote.close()

    done = read_completion(ckpt)
    assert done is not None and done.step == TOTAL and done.run_id == "job-uid"
    (end,) = events(ckpt, "end")
    assert end["step"] == TOTAL
    steps = events(ckpt, "step")
    assert {s["globalBatchSize"] for s in steps} == {BATCH}
    assert all(isinstance(s["groups"], int) and s["groups"] >= 1 for s in steps)
    # A line's rate counts only the steps its writer trained since its last line (every group
    # tallies at the same steps) or, healed since, from its heal on: never more than the steps
    # since the line before. A group healed from a peer at step N once counted the N steps
    # before it too (on kind: 38184 samples/s from a group that rejoined, 700 before and after).
    for before, line in itertools.pairwise(steps):
        assert 0 < line["rateSteps"] <= line["step"] - before["step"], (before, line)
    assert groups.kills >= KILLS
    stats = check_exactly_once(samples)
    print(
        f"kills {groups.kills}, survivor crashes 0, {stats}, total {time.monotonic() - began:.1f}s"
    )


NPROC_TOTAL = 40


def two_process_group(
    zygote: Zygote,
    name: str,
    env: dict[str, str],
    settings: dict[str, Any],
    ckpt: Path,
    pace: Path,
    stops: bool = False,
) -> list[Warm]:
    """A group of two processes (local ranks 0 and 1 of one pod), paced by ``pace``; with
    ``stops`` each rank's stop file is ``stop-<name>-<rank>`` in the zygote's folder."""
    port = free_port()
    workers = []
    for rank in range(2):
        mine = {**env, "DDPJOB_TEST_STEP_S": str(pace)}
        if stops:
            mine["DDPJOB_TEST_STOP_AT"] = str(zygote.workdir / f"stop-{name}-{rank}")
        workers.append(
            zygote.fork(
                f"{name}-rank{rank}",
                env=mine,
                settings=settings,
                checkpoint_dir=ckpt,
                rank=rank,
                nproc=2,
                port=port,
            )
        )
    return workers


@pytest.mark.timeout(300)
def test_groups_of_two_processes_split_by_local_rank_and_heal_per_local_rank(
    launcher: Launcher, tmp_path: Path
) -> None:
    """nprocPerNode 2: local rank r of each group is ring r across the groups; a group killed
    mid-run (both its processes) joins again and each of its ranks heals from its peer rank;
    every committed step still used its whole global batch once."""
    began = time.monotonic()
    ckpt, samples = tmp_path / "ckpt", tmp_path / "samples"
    _, url = lighthouse(launcher, heartbeat_ms=1000, join_ms=300)
    zygote = Zygote.start(launcher)
    settings = {**SETTINGS, "maxSteps": NPROC_TOTAL, "checkpointEverySteps": 0}

    # Paced (a step at most every STEP_S): unpaced, group a alone trained its last 30 steps in
    # 0.6 s, before the restarted group b could join and heal.
    pace = launcher.workdir / "pace"
    pace.write_text(str(STEP_S))

    def start(group: int, name: str) -> list[Warm]:
        env = group_env(group, url, groups=2, timeout_s=GROUP_TIMEOUT_S, samples=samples)
        return two_process_group(zygote, name, env, settings, ckpt, pace)

    try:
        first, second = start(0, "a"), start(1, "b")
        wait_until(lambda: committed_step(samples) >= 10, 120, "step 10")
        for worker in second:
            zygote.kill(worker)
        again = start(1, "b-again")
        wait_until(lambda: all(w.code is not None for w in first + again), 200, "the end")
        for worker in first + again:
            assert worker.code == 0, worker.output()[-3000:]
            # local rank 0 hosts its group's store and stays until rank 1 has read the end
            assert "store is gone" not in worker.output(), worker.output()[-3000:]
        assert "healed from a live peer" in again[0].output()  # rank 0 logs at INFO
        for worker in again:  # each rank's first step is the live peers' step: it healed
            rows = sample_lines(samples)
            mine = [
                r["step"]
                for r in rows
                if r["file"].endswith(f"-{worker.pid}.jsonl") and r["event"] != "paced"
            ]
            assert min(mine) >= 10, (worker.name, mine[:3])
    finally:
        zygote.close()
    stats = check_exactly_once(samples, total=NPROC_TOTAL, nproc=2)
    assert read_completion(ckpt) is not None
    print(f"2 groups x 2 processes: {stats}, {time.monotonic() - began:.1f}s")


@pytest.mark.timeout(300)
def test_a_group_whose_heal_completed_on_one_local_rank_only_starts_again(
    launcher: Launcher, tmp_path: Path
) -> None:
    """nprocPerNode 2: each local rank heals from its peer rank of the source group. Group 2
    joins while its source (torchft's pick of groups 0 and 1) holds rank 1 where it would serve
    the heal; the source is SIGKILLed once group 2's rank 0 has healed, so group 2's rank 1
    fails its heal. Its ranks are then at different steps: they agree on that and end at once,
    named (torchrun's worker restart or the pod's replacement starts the group again); started
    again, the group heals on both ranks from the other group, which trained on throughout, and
    all end 0 with every step's batch used once. Before, rank 0 trained while rank 1 asked for
    a quorum again: each waited on the other until the local process group's timeout."""
    began = time.monotonic()
    ckpt, samples = tmp_path / "ckpt", tmp_path / "samples"
    _, url = lighthouse(launcher, heartbeat_ms=1000, join_ms=300)
    zygote = Zygote.start(launcher)
    settings = {**SETTINGS, "maxSteps": NPROC_TOTAL + 20, "checkpointEverySteps": 0}
    pace = launcher.workdir / "pace"
    pace.write_text(str(STEP_S))

    def start(group: int, name: str) -> list[Warm]:
        env = group_env(group, url, groups=3, timeout_s=GROUP_TIMEOUT_S, samples=samples)
        return two_process_group(zygote, name, env, settings, ckpt, pace, stops=True)

    try:
        groups = {"a": start(0, "a"), "b": start(1, "b")}
        wait_until(lambda: committed_step(samples) >= 10, 120, "step 10")
        stops = {name: launcher.workdir / f"stop-{name}-1" for name in groups}
        for stop in stops.values():
            stop.write_text("serve")
        joiner = start(2, "c")
        # torchft picks the source: the group whose rank 1 is asked to serve
        source_name = wait_until(
            lambda: next((n for n, f in stops.items() if Path(f"{f}.reached").exists()), None),
            60,
            "the source's rank 1 serving",
        )
        for stop in stops.values():
            if not Path(f"{stop}.reached").exists():
                stop.unlink()
        source = groups.pop(source_name)
        (survivor,) = groups.values()
        wait_until(lambda: "healed from a live peer" in joiner[0].output(), 60, "rank 0's heal")
        for worker in source:
            zygote.kill(worker)
        for worker in joiner:
            wait_until(lambda w=worker: w.code is not None, 60, f"{worker.name} to end")
            assert worker.code not in (None, 0)
            assert "came out of one quorum at different steps" in worker.output(), worker.name
        again = start(2, "c-again")
        for worker in survivor + again:
            wait_until(lambda w=worker: w.code is not None, 200, f"{worker.name} to end")
            assert worker.code == 0, worker.output()[-3000:]
        assert "healed from a live peer" in again[0].output()
    finally:
        zygote.close()
    stats = check_exactly_once(samples, total=NPROC_TOTAL + 20, nproc=2)
    assert read_completion(ckpt) is not None
    print(f"a heal that completed on one rank of two: {stats}, {time.monotonic() - began:.1f}s")


LIVE_STEPS = 40


@pytest.mark.timeout(300)
def test_groups_that_join_while_the_only_live_one_is_mid_step_wait_for_it_and_heal(
    launcher: Launcher, tmp_path: Path
) -> None:
    """Groups 1 and 2 are SIGKILLed and started again while group 0, the only live one, is held
    mid-step (at its forward pass: alive, heartbeating). The two are a majority of the groups
    that heartbeat, so once its join timeout has passed the lighthouse gives them a quorum of
    their own, at max step 0, which alone reads as "every group was lost". Group 0's beat
    (``ddp_trainer.per_step.beats``: it has trained, and beat a moment ago) says otherwise: they
    quorum again until group 0, let go, is in a quorum with them, and heal from it. Before,
    they loaded the checkpoint and trained a second history beside group 0's."""
    settings = {**SETTINGS, "maxSteps": LIVE_STEPS, "checkpointEverySteps": 5}
    groups, zygote, _, samples = three_groups_past_step_10(launcher, tmp_path, settings)
    try:
        groups.hold(0, "forward")  # mid-step
        held_at = committed_step(samples)
        groups.kill(1)
        groups.kill(2)
        joiners = [groups.start_warm(1), groups.start_warm(2)]
        # their quorum without group 0: they wait for it (before: loaded the checkpoint)
        outcomes = ("waiting for that group", "resumed from checkpoint")
        wait_until(
            lambda: any(o in j.output() for j in joiners for o in outcomes),
            60,
            "the joiners' quorum of step 0",
        )
        groups.disarm(0)
        groups.pace.unlink()
        groups.wait_ended(range(3), 120)
        for member in groups.current.values():
            assert groups.code(member) == 0, member.output()[-3000:]
    finally:
        zygote.close()
    for joiner in joiners:
        said = joiner.output()
        assert "healed from a live peer" in said and "resumed from checkpoint" not in said, said
    files = tuple(f"-{j.pid}.jsonl" for j in joiners)
    theirs = [
        r["step"]
        for r in sample_lines(samples)
        if r["event"] == "committed" and r["file"].endswith(files)
    ]
    assert theirs and min(theirs) >= held_at, (held_at, theirs[:5])
    check_exactly_once(samples, total=LIVE_STEPS)


@pytest.mark.timeout(300)
def test_fp16_groups_step_their_grad_scaler_alike_on_committed_steps_and_a_healed_one_takes_it(
    launcher: Launcher, tmp_path: Path
) -> None:
    """fp16 autocast with a GradScaler (the CUDA path of GPUs without bf16), here on the CPU over
    gloo. Group 1 is SIGKILLed mid-step (at its forward pass), so the others' all-reduce of that
    step fails and they redo it without it; group 1 is started again and heals. Every group
    commits each step with the same scale and growth count (the new group 1 goes on from those
    it healed to), and from each step to the next the scaler makes exactly one update: the count
    grows by one at the same scale, or the scale halves after an overflow and the count starts
    again. A scaler also updated on the failed try would be a count ahead. And the groups'
    scaler ends at the scale of Restart mode's three ranks on the same run: as many overflows
    (one, near step 20, here), no more; a share's backward of its loss terms times its mean
    (not of its mean, as Restart's ranks) overflowed the first three steps and skipped them."""
    settings = {**SETTINGS, "amp": "fp16", "maxSteps": LIVE_STEPS}
    groups, zygote, _, samples = three_groups_past_step_10(launcher, tmp_path, settings)
    try:
        groups.hold(1, "forward")  # mid-step
        failed_at = committed_step(samples)
        groups.kill(1)
        again = groups.start_warm(1)
        wait_until(lambda: 1 in groups.live(), 120, "the new group 1 to commit a step")
        groups.pace.unlink()
        groups.wait_ended(range(3), 120)
        assert not groups.crashed(), "\n".join(groups.crashed())
    finally:
        zygote.close()
    assert "healed from a live peer" in again.output(), again.output()[-3000:]
    check_exactly_once(samples, total=LIVE_STEPS)  # every step committed, each sample once
    scaler = scaler_by_step(samples, LIVE_STEPS)  # every group alike, one update per step
    restart = launcher.standalone(
        "restart", nproc=3, settings=settings, checkpoint_dir=tmp_path / "restart"
    )
    assert restart.wait(120) == 0, restart.tail()
    _, saved = CheckpointStore(tmp_path / "restart").latest() or (None, {})
    restart_end = (saved["scaler"]["scale"], saved["scaler"]["_growth_tracker"])
    # Restart's overflows, no more: the same scale (the same number of halvings; their steps
    # may differ by a few, the two modes' sums round differently)
    assert scaler[-1][0] == restart_end[0], (scaler, restart_end)
    rows = sample_lines(samples)
    fed = Counter((r["file"], r["step"]) for r in rows if r["event"] == "fed")
    assert any(n > 1 for n in fed.values()), "no group tried a step twice"  # the failed step
    theirs = f"-{again.pid}.jsonl"
    new = [r["step"] for r in rows if r["event"] == "committed" and r["file"].endswith(theirs)]
    assert new and new[0] >= failed_at, (failed_at, new[:3])  # it healed past the failed step


NON_FINITE_LIMIT = 20  # trainer.maxNonFiniteSteps of the test below
NON_FINITE_RE = re.compile(
    r"training failed: (\d+) consecutive steps with a non-finite loss or gradient at step (\d+)"
)


@pytest.mark.timeout(300)
def test_a_healed_group_counts_non_finite_steps_in_a_row_on_from_its_peers(
    launcher: Launcher, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """trainer.maxNonFiniteSteps with every loss NaN from some step on (while a flag file
    exists): each non-finite step is skipped and counted alike on every group (the all-reduce
    spreads one share's NaN to all). Group 1 is SIGKILLed after a few of them and started again;
    groups 0 and 2 are held before their next quorum until it is at its first, so it heals from
    one of them mid-streak. Then every group, the healed one too, fails the run at the same step,
    with exit code 3 and the setting named. A healed group that counted from 0 failed that many
    steps later, training on alone after its peers had failed the run."""
    flag = tmp_path / "nan"
    monkeypatch.setenv("NAN_FLAG", str(flag))  # the groups' environment
    settings = {
        **SETTINGS,
        "workload": "padded_workload:nan_while_flagged",
        "maxSteps": 200,
        "maxNonFiniteSteps": NON_FINITE_LIMIT,
    }
    groups, zygote, _, samples = three_groups_past_step_10(launcher, tmp_path, settings)
    try:
        flagged = committed_step(samples)  # read first: every later step's loss may be NaN
        flag.touch()
        wait_until(lambda: committed_step(samples) >= flagged + 3, 60, "non-finite steps")
        groups.kill(1)
        groups.hold(0, "quorum")
        groups.hold(2, "quorum")
        # the new group 1 is held at its first quorum too, its Manager up, so that the others
        # take no step until it can join (else, slow to start, it could come after the end)
        again = groups.start_warm(1, stop_at="quorum")
        assert groups.reached(1, 120), "the new group 1 never reached its first quorum"
        for group in (1, 0, 2):
            groups.disarm(group)
        groups.wait_ended(range(3), 120)
    finally:
        zygote.close()
    assert "healed from a live peer" in again.output(), again.output()[-3000:]
    ends = {}
    for group in range(3):
        member = groups.current[group]
        found = NON_FINITE_RE.findall(member.output())
        assert groups.code(member) == 3 and found, member.output()[-3000:]
        ends[group] = tuple(int(n) for n in found[-1])
    assert len(set(ends.values())) == 1, ends  # the same step on every group
    (in_row, step), *_ = ends.values()
    # the first non-finite step: the one after the last committed one seen, or one of the next
    # two (their loss may have been computed before the flag was written)
    first = range(flagged + 1, flagged + 4)
    assert in_row == NON_FINITE_LIMIT and step - in_row + 1 in first, (ends, flagged)


LIGHTHOUSE_ROUNDS = 3
STALL_BOUND_S = 10.0  # the bound for a lost machine; a new lighthouse's first step ~1 s


@pytest.mark.timeout(300)
def test_a_new_lighthouse_after_groups_came_and_went_stalls_no_group_for_long(
    launcher: Launcher, tmp_path: Path
) -> None:
    """Rounds of: a group restarted (the lighthouse's quorum ids move on), then the lighthouse
    SIGKILLed once every group waits on it, and a new one started on its port. The new one
    numbers its quorums from 1 again. torchft's Manager builds each quorum's process group at
    the store prefix of the quorum's id, which must be new each time: with the lighthouse's ids,
    a new lighthouse's quorums could meet the gloo addresses that the old one's quorums of the
    same ids left there (seen on loopback: all three groups stalled 25-32 s in gloo connect
    timeouts, in one round of four, 2026-11-27). So: the quorums after a new lighthouse have ids
    no quorum before it had (``ddp_trainer.per_step.replicas.QuorumIds``), and every group's
    next step after the new lighthouse listens comes within the bound."""
    ckpt, samples = tmp_path / "ckpt", tmp_path / "samples"
    light, url = lighthouse(launcher, heartbeat_ms=1000, join_ms=300)
    port = int(url.rsplit(":", 1)[1])
    zygote = Zygote.start(launcher)
    groups = Groups(launcher, zygote, url, ckpt, samples)
    stalls = []
    try:
        for group in range(3):
            groups.start_warm(group)
        wait_until(lambda: len(groups.live()) == 3, 180, "three groups training")
        for round_ in range(LIGHTHOUSE_ROUNDS):
            group = round_ % 3
            groups.kill(group)
            groups.start_warm(group)
            wait_until(lambda g=group: g in groups.live(), 120, f"group {group} back")
            waiting = {g: groups.current[g].output().count("no quorum") for g in range(3)}
            killed = time.time()
            light.kill_tree()
            light.popen.wait()
            wait_until(
                lambda w=waiting: all(
                    groups.current[g].output().count("no quorum") > w[g] for g in range(3)
                ),
                60,
                "every group to miss the lighthouse",
            )
            light, _ = lighthouse(launcher, heartbeat_ms=1000, join_ms=300, port=port)
            back = time.time()

            def next_steps(since: float = back) -> dict[str, float] | None:
                first: dict[str, float] = {}
                for row in sample_lines(samples):
                    if row["event"] == "committed" and row["time"] > since:
                        first.setdefault(row["file"].rsplit("-", 1)[0], row["time"] - since)
                return first if len(first) == 3 else None

            after = wait_until(next_steps, 120, "every group's step after the new lighthouse")
            stalls.append(round(max(after.values()), 2))
            rows = sample_lines(samples)
            old = {r["quorum"] for r in rows if "quorum" in r and r["time"] < killed}
            new = {r["quorum"] for r in rows if "quorum" in r and r["time"] > back}
            assert not old & new, f"round {round_}: quorum ids used again: {old & new}"
        assert not groups.crashed(), "\n".join(groups.crashed())
    finally:
        zygote.close()
    print(f"a step of every group after each new lighthouse, s: {stalls}")
    assert max(stalls) < STALL_BOUND_S, stalls


WRITER_STEPS = 40


@pytest.mark.timeout(300)
def test_a_writer_lost_after_the_others_committed_its_step_leaves_no_step_without_a_line(
    launcher: Launcher, tmp_path: Path
) -> None:
    """Groups differ on a step's commit when the writer is lost mid-step: here it is SIGKILLed
    where it would vote on a step whose all-reduce had completed, so the two others commit that
    step and it does not. It wrote no line for the step; the next writer, the first of the groups
    at the quorum's step, writes its own line of it as it takes over, so the run log has one
    line for every step (before, that step had none, and on kind a powered-off writer's machine
    left the run log a step short)."""
    settings = {**SETTINGS, "maxSteps": WRITER_STEPS, "logEverySteps": 1}
    groups, zygote, ckpt, samples = three_groups_past_step_10(launcher, tmp_path, settings)
    try:
        groups.hold(0, "commit")  # the writer at its commit vote
        groups.kill(0)
        groups.wait_ended((1, 2), 120)
        assert not groups.crashed(), "\n".join(groups.crashed())
    finally:
        zygote.close()
    rows = sample_lines(samples)
    last = max(r["step"] for r in rows if r["event"] == "fed" and r["file"].startswith("job-0-"))
    committers = {r["file"][:5] for r in rows if r["event"] == "committed" and r["step"] == last}
    assert committers == {"job-1", "job-2"}, committers  # the others committed it, not the writer
    lines = events(ckpt, "step")
    logged = [line["step"] for line in lines]
    assert logged == list(range(1, WRITER_STEPS + 1)), f"step {last + 1} lost: {logged}"
    writers = [(line["step"], line["group"]) for line in lines]
    assert dict(writers)[last] == 0, writers  # group 0 wrote the step before the lost one
    assert {g for s, g in writers if s > last} == {1}, writers  # then group 1, that one too


@pytest.mark.timeout(300)
def test_a_suspended_jobs_writer_saves_the_last_committed_step_even_from_a_quorum_wait(
    launcher: Launcher, tmp_path: Path
) -> None:
    """A suspended job, as Kubernetes stops it: every group SIGTERMed and the lighthouse gone.
    The writer's peer goes first and the lighthouse with it, so the writer is mid-step with a
    peer that left, or waiting for a quorum that cannot form: it notices SIGTERM when that try
    ends (within ddp_api.contract.quorum_timeout_s, which the operator adds to PerStep pods'
    grace period) and saves the step training stopped at: nothing trained is lost. Resumed,
    the groups go on from the step after it."""
    ckpt, samples = tmp_path / "ckpt", tmp_path / "samples"
    light, url = lighthouse(launcher, heartbeat_ms=1000, join_ms=300)
    pace = launcher.workdir / "pace"
    pace.write_text(str(STEP_S))
    settings = {**SETTINGS, "checkpointEverySteps": 0}  # only SIGTERM's checkpoint

    def start(group: int, name: str) -> Proc:
        env = group_env(group, url, groups=2, timeout_s=GROUP_TIMEOUT_S, samples=samples)
        env["DDPJOB_TEST_STEP_S"] = str(pace)
        return pod(launcher, name, env=env, settings=settings, checkpoint_dir=ckpt)

    writer, peer = start(0, "pod-0"), start(1, "pod-1")
    # Both in the quorum (the first group up trains alone until the other has healed): the
    # writer is its participating rank 0, the lowest replica id.
    wait_until(lambda: trained_together(samples, 2, 10), 240, "both groups past step 10")
    peer.signal(signal.SIGTERM)
    peer.wait(60)
    light.kill_tree()
    light.popen.wait()
    signalled = time.monotonic()
    writer.signal(signal.SIGTERM)
    writer.wait(contract.quorum_timeout_s(GROUP_TIMEOUT_S) + 30)
    stopped_s = time.monotonic() - signalled
    mine = steps_committed(samples, by="job-0-")
    assert "SIGTERM: stopping at step" in writer.output(), writer.tail()
    (saved,) = events(ckpt, "checkpoint")
    assert saved["synchronous"] and saved["step"] == max(mine), (saved, max(mine))
    found = CheckpointStore(ckpt).latest()
    assert found is not None and found[0].step == max(mine)
    print(f"the writer stopped {stopped_s:.1f}s after SIGTERM, saving step {max(mine)}")

    # Resumed: a new lighthouse and both groups again; with no live group to heal from they
    # load that checkpoint and go on from the step after it, to the end.
    _, url = lighthouse(launcher, heartbeat_ms=1000, join_ms=300)
    pace.unlink()  # the rest at the machine's speed
    resumed_at = time.time()
    again = [start(0, "pod-0-resumed"), start(1, "pod-1-resumed")]
    for group in again:
        assert group.wait(240) == 0, group.tail()
    after = steps_committed(samples, since=resumed_at)
    assert min(after) == max(mine) + 1 and max(after) == SETTINGS["maxSteps"], (
        min(after),
        max(mine),
    )
    said = "".join(group.output() for group in again)
    assert f"no live group to heal from: resumed from checkpoint step-{max(mine):08d}.pt" in said
    assert read_completion(ckpt) is not None


@pytest.mark.timeout(300)
def test_a_group_resumed_while_the_old_writer_still_saves_waits_for_its_checkpoint(
    launcher: Launcher, tmp_path: Path
) -> None:
    """A job resumed while its old writer is still writing its SIGTERM checkpoint: Kubernetes
    recreates pod i once the old pod i is gone, and the writer's pod may still be terminating.
    Groups 1 and 2 go first; the writer, group 0, is held just before its save. New groups 1
    and 2 start: they are a majority of the groups the lighthouse sees (the writer's Manager
    still heartbeats), so they get a quorum of their own at step 0, with no live group in it.
    But the writer beats until its save is over, so they wait for it instead of loading the
    checkpoint that is there before the save (here none: they would train from step 0 again).
    Once they say so the writer saves and exits, its beats age, and they load its checkpoint:
    no step lost."""
    ckpt, samples = tmp_path / "ckpt", tmp_path / "samples"
    _, url = lighthouse(launcher, heartbeat_ms=1000, join_ms=300)
    pace = launcher.workdir / "pace"
    pace.write_text(str(STEP_S))
    hold_writer = launcher.workdir / "stop-writer"
    settings = {**SETTINGS, "checkpointEverySteps": 0}  # only SIGTERM's checkpoint

    def start(group: int, name: str) -> Proc:
        env = group_env(group, url, groups=3, timeout_s=GROUP_TIMEOUT_S, samples=samples)
        env["DDPJOB_TEST_STEP_S"] = str(pace)
        env["DDPJOB_TEST_STOP_AT"] = str(hold_writer if group == 0 else tmp_path / "no-stop")
        return pod(launcher, name, env=env, settings=settings, checkpoint_dir=ckpt)

    writer, *peers = (start(group, f"pod-{group}") for group in range(3))
    wait_until(lambda: trained_together(samples, 3, 10), 240, "three groups past step 10")
    for peer in peers:  # pods 1 and 2 go first; the writer trains on alone
        peer.signal(signal.SIGTERM)
    for peer in peers:
        peer.wait(60)
    hold_writer.write_text("save")
    writer.signal(signal.SIGTERM)
    wait_until(lambda: Path(f"{hold_writer}.reached").exists(), 60, "the writer at its save")
    assert CheckpointStore(ckpt).latest() is None  # nothing saved yet

    pace.unlink()  # the rest at the machine's speed
    resumed_at = time.time()
    again = [start(group, f"pod-{group}-resumed") for group in (1, 2)]
    wait_until(
        lambda: any("not loading the checkpoint" in group.output() for group in again),
        60,
        "the new groups to wait for the writer",
    )
    hold_writer.unlink()  # the writer saves and exits
    writer.wait(60)
    mine = steps_committed(samples, by="job-0-")
    found = CheckpointStore(ckpt).latest()
    assert found is not None and found[0].step == max(mine), (found and found[0], max(mine))
    for group in again:
        assert group.wait(240) == 0, group.tail()
    after = steps_committed(samples, since=resumed_at)
    assert min(after) == max(mine) + 1, (min(after), max(mine))  # the step after the saved one
    said = "".join(group.output() for group in again)
    assert f"resumed from checkpoint step-{max(mine):08d}.pt" in said, said[-3000:]


SLOW_SAVE_S = 32.0  # longer than torchrun's own wait for its workers to stop (30 s)


@pytest.mark.timeout(240)
def test_a_sigterm_checkpoint_slower_than_torchruns_own_30_s_wait_is_written(
    launcher: Launcher, tmp_path: Path
) -> None:
    """A pod's SIGTERM reaches torchrun (through the node wrapper), which passes it to its
    workers and SIGKILLs them after ``PET_SHUTDOWN_TIMEOUT``: its own default is 30 s whatever
    the pod's grace period, so a SIGTERM checkpoint slower than that (a large model, a slow
    volume) was killed before it was complete. The operator sets it from the grace period
    (``ddp_operator.render``). Here a node pod with the rendered value has its writer's save
    take SLOW_SAVE_S (held before it): the worker is still there when the hold ends, and the
    checkpoint of the step training stopped at is written. Without the variable the worker
    was SIGKILLed 30 s after SIGTERM, nothing saved. (A PerStep group alone, for its hold
    before the save; Restart pods get the same variable.)"""
    meta = {"name": "job", "namespace": "ns", "uid": "job-uid"}
    job = DDPJob.model_validate(
        {"metadata": meta, "spec": {"nodes": 1, "faultTolerance": {"mode": "PerStep"}}}
    )
    rendered = render.render_worker(job, 0, 0, render.OperatorConfig(default_image="t"))
    env_list = rendered["spec"]["containers"][0]["env"]
    stop_s = next(e["value"] for e in env_list if e["name"] == "PET_SHUTDOWN_TIMEOUT")
    assert float(stop_s) > SLOW_SAVE_S + 5, stop_s

    ckpt, samples = tmp_path / "ckpt", tmp_path / "samples"
    _, url = lighthouse(launcher, heartbeat_ms=1000, join_ms=300)
    pace, hold = launcher.workdir / "pace", launcher.workdir / "stop"
    pace.write_text(str(STEP_S))
    env = group_env(0, url, groups=1, timeout_s=GROUP_TIMEOUT_S, samples=samples)
    env |= {
        "DDPJOB_TEST_STEP_S": str(pace),
        "DDPJOB_TEST_STOP_AT": str(hold),
        "PET_SHUTDOWN_TIMEOUT": stop_s,
    }
    settings = {**SETTINGS, "checkpointEverySteps": 0}  # only SIGTERM's checkpoint
    node = pod(launcher, "pod-0", env=env, settings=settings, checkpoint_dir=ckpt)
    wait_until(lambda: committed_step(samples) >= 5, 120, "five steps")
    hold.write_text("save")
    node.signal(signal.SIGTERM)
    wait_until(lambda: Path(f"{hold}.reached").exists(), 60, "the writer at its save")
    held = time.monotonic()
    wait_until(
        lambda: time.monotonic() - held >= SLOW_SAVE_S or node.popen.poll() is not None,
        SLOW_SAVE_S + 10,
        "the slow save's end",
    )
    alive_after_s = time.monotonic() - held
    killed = node.popen.poll() is not None
    hold.unlink()  # the save goes on
    node.wait(60)
    assert not killed, f"the pod ended {alive_after_s:.1f}s into its writer's save\n{node.tail()}"
    trained = committed_step(samples)
    found = CheckpointStore(ckpt).latest()
    assert found is not None and found[0].step == trained, (found and found[0], trained)


@pytest.mark.timeout(240)
def test_a_group_that_has_not_settled_where_it_starts_writes_no_checkpoint(
    launcher: Launcher, tmp_path: Path
) -> None:
    """New jobs on a folder that another run's checkpoints are in (a job deleted, edited and
    applied again on the same claim). A group holds no state of its run until its first quorum
    has settled where it starts (a heal, the checkpoint loaded, or nothing to load), so until
    then it writes no checkpoint, not even as the writer:

    - the load refuses the checkpoint (other settings): IncompatibleResume, in the pod's
      termination message, which fails the job at once. Before, the failure was taken for a
      failed step and the writer saved its fresh model as step-00000000.pt beside the other
      run's (seen on kind, where the job's status then named that checkpoint);
    - SIGTERM while the group waits for a live group to heal from (a beat of one that trained
      30 steps) rather than load the checkpoint: it stops. Before, it saved its SIGTERM
      checkpoint, of step 0 too, while that group might be saving to the same manifest."""
    ckpt, samples = tmp_path / "ckpt", tmp_path / "samples"
    _, url = lighthouse(launcher, heartbeat_ms=1000, join_ms=300)

    def start(name: str, settings: dict[str, Any]) -> Proc:
        env = group_env(0, url, groups=1, timeout_s=GROUP_TIMEOUT_S, samples=samples)
        env |= {"PET_RDZV_ID": f"{name}-uid", "DDPJOB_TERMINATION_LOG": str(tmp_path / name)}
        return pod(launcher, name, env=env, settings=settings, checkpoint_dir=ckpt)

    run = {**SETTINGS, "maxSteps": 4, "checkpointEverySteps": 2, "seed": 3}
    first = start("first", run)
    assert first.wait(120) == 0, first.tail()
    before = checkpoint_files(ckpt)
    assert {"step-00000002.pt", "step-00000004.pt", "manifest.json"} <= set(before), before.keys()

    refused = start("refused", {**run, "seed": 4})
    assert refused.wait(120) != 0, refused.tail()
    said = (tmp_path / "refused").read_text()
    assert said.startswith("IncompatibleResume: cannot resume"), said
    assert "(seed: the checkpoint's 3, now 4)" in said, said
    after = checkpoint_files(ckpt)
    assert after == before, sorted(set(after) ^ set(before)) or "a file was rewritten"

    beat = ckpt / "groups" / "7.json"
    live = threading.Event()

    def beating() -> None:  # group 7 trained 30 steps and beats, as a live group mid-step does
        while not live.wait(0.5):
            beat.write_text(json.dumps({"step": 30, "time": time.time()}))

    beater = threading.Thread(target=beating, daemon=True)
    beater.start()
    try:
        waiting = start("waiting", run)
        wait_until(lambda: "not loading the checkpoint" in waiting.output(), 60, "the wait")
        waiting.signal(signal.SIGTERM)
        waiting.wait(60)
        assert "SIGTERM: stopping at step 0" in waiting.output(), waiting.tail()
    finally:
        live.set()
    after = checkpoint_files(ckpt)
    assert after == before, sorted(set(after) ^ set(before)) or "a file was rewritten"
    assert [line["step"] for line in events(ckpt, "checkpoint")] == [2, 4], "a checkpoint line"


def test_the_lighthouse_pod_logs_torchfts_warnings_not_its_lines_for_every_step(
    launcher: Launcher,
) -> None:
    """The lighthouse as the operator renders it (its command and RUST_LOG), on loopback: at
    torchft's default level it writes a line when it listens and about seven for every step;
    at the pod's it writes none of them. A job's spec.template.env may name another level."""

    def started(job: DDPJob, name: str) -> str:
        pod = render.render_lighthouse(job, render.OperatorConfig(default_image="t"))
        c = pod["spec"]["containers"][0]
        port = free_port()
        command = [str(LIGHTHOUSE), *c["command"][1:-1], f"127.0.0.1:{port}"]
        env = {e["name"]: e["value"] for e in c["env"]}
        out = launcher.workdir / f"{name}.log"
        with open(out, "wb") as f:
            proc = subprocess.Popen(
                command, env={**os.environ, **env}, stdout=f, stderr=subprocess.STDOUT
            )
        try:
            wait_until(lambda: _accepts(port), 30, f"{name} to listen")
            time.sleep(0.5)  # torchft logs its first quorum tick at once; give it the time
        finally:
            proc.terminate()
            proc.wait(10)
        return out.read_text()

    meta = {"name": "j", "namespace": "ns", "uid": "u"}
    spec: dict[str, Any] = {"nodes": 2, "faultTolerance": {"mode": "PerStep"}}
    job = DDPJob.model_validate({"metadata": meta, "spec": spec})
    assert started(job, "quiet") == ""
    spec["template"] = {"env": [{"name": "RUST_LOG", "value": "info"}]}
    told = DDPJob.model_validate({"metadata": meta, "spec": spec})
    assert "Lighthouse listening" in started(told, "told")


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


END_STEPS = 12


@pytest.mark.timeout(300)
def test_with_min_groups_2_a_group_lost_at_the_last_quorum_is_replaced_and_a_late_one_exits_0(
    launcher: Launcher, tmp_path: Path
) -> None:
    """minGroups 2, two groups. After the last step the writer needs one more quorum (it saves
    and marks the run complete there): group 1 is SIGKILLed at that quorum, so the writer waits.
    The operator replaces a group lost after the last step while fewer than minGroups are left
    (``ddp_operator.planner.converge``); here the replacement heals at the last step, the
    quorum forms, the writer completes the run and the replacement exits 0 on the record. Then
    a third group, started after the end (as a replacement made a moment too late is), gets no
    quorum and, seeing the record after its failed try, exits 0 rather than trying forever."""
    ckpt, samples = tmp_path / "ckpt", tmp_path / "samples"
    _, url = lighthouse(launcher, heartbeat_ms=1000, join_ms=300, min_groups=2)
    zygote = Zygote.start(launcher)
    settings = {**SETTINGS, "maxSteps": END_STEPS, "checkpointEverySteps": 0}
    stop = launcher.workdir / "stop-lost"
    stop.write_text(f"quorum@{END_STEPS}")  # group 1's quorum after its last step, on any machine

    def start(group: int, name: str) -> Warm:
        env = group_env(group, url, groups=2, timeout_s=GROUP_TIMEOUT_S, samples=samples)
        env |= {
            "DDPJOB_MIN_GROUPS": "2",
            "DDPJOB_TEST_STOP_AT": str(stop.with_name(f"stop-{name}")),
        }
        return zygote.fork(name, env=env, settings=settings, checkpoint_dir=ckpt)

    try:
        writer, lost = start(0, "writer"), start(1, "lost")
        wait_until(lambda: Path(f"{stop}.reached").exists(), 120, "group 1 at its last quorum")
        zygote.kill(lost)
        replacement = start(1, "replacement")
        for member in (writer, replacement):
            wait_until(lambda m=member: m.code is not None, 120, f"{member.name} to end")
            assert member.code == 0, member.output()[-3000:]
        assert "healed from a live peer" in replacement.output()
        assert "the final checkpoint is another group's" in replacement.output()
        done = read_completion(ckpt)
        assert done is not None and done.step == END_STEPS
        late = start(2, "late")
        wait_until(lambda: late.code is not None, 120, "the late group to end")
        assert late.code == 0, late.output()[-3000:]
        assert "no quorum" in late.output() and "another group's" in late.output()
    finally:
        zygote.close()
    (end,) = events(ckpt, "end")
    assert end["step"] == END_STEPS and [s["group"] for s in events(ckpt, "step")][-1] == 0
