"""The one test harness: kubectl on one cluster, applying objects, DDPJobs' status and Events,
waits (a deadline, or a stall timeout for a job's phase) and what to read when a wait fails.

The control-plane tests, the end-to-end scenarios (through
:class:`~ddp_devcluster.kind.stack.KindStack`), the cluster suite and ``make demo`` all use it;
each adds only what is its own (kwok's exit codes, Kueue's queues, holds and claims, kind's
machines).

A harness may have a namespace of its own (``ns``): kubectl runs in it unless a call says
otherwise. Methods about one object take its name first and the namespace as the keyword
``ns`` (the harness's own when left out).

    h = Harness(kubeconfig, ns="demo")
    h.apply_example("digits.yaml")
    h.phase("digits", "Succeeded", stall_s=300)
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import yaml

from ddp_api.contract import KIND
from ddp_api.ddpjob import TERMINAL_PHASES
from ddp_api.pods import selector as worker_selector

from . import reads
from .operator_process import NAMESPACE, REPO
from .plane import kubectl
from .polling import until

T = TypeVar("T")
EXAMPLES = REPO / "manifests" / "examples"


def holding_at(*steps: int, last: int | None = None) -> Callable[[dict[str, Any]], None]:
    """An edit of a DDPJob (``apply_example``'s ``edit``) that makes it pause after ``steps``
    until released (spec.trainer.holdAtSteps): a test acts at a known step, however fast or
    slow the machine trains. ``last``: its training ends there (spec.trainer.maxSteps), for a
    test whose scene is over a few steps after its holds."""

    def edit(job: dict[str, Any]) -> None:
        job["spec"]["trainer"]["holdAtSteps"] = list(steps)
        if last is not None:
            job["spec"]["trainer"]["maxSteps"] = last

    return edit


def claim_names(obj: Any) -> set[str]:
    """Every ``claimName`` anywhere in ``obj`` (a DDPJob's checkpoint volume, its pod
    template's volumes)."""
    if isinstance(obj, dict):
        found = {str(obj["claimName"])} if isinstance(obj.get("claimName"), str) else set()
        return found.union(*(claim_names(v) for v in obj.values()))
    if isinstance(obj, list):
        return set().union(*(claim_names(v) for v in obj))
    return set()


def claims_unused(docs: Sequence[dict[str, Any]]) -> set[int]:
    """The ``id`` of each PersistentVolumeClaim among ``docs`` that no DDPJob among them names;
    none when there is no DDPJob (claims applied on their own, for jobs applied later)."""
    jobs = [d for d in docs if d.get("kind") == KIND]
    if not jobs:
        return set()
    named = set().union(*(claim_names(j) for j in jobs))
    return {
        id(d)
        for d in docs
        if d.get("kind") == "PersistentVolumeClaim" and d["metadata"]["name"] not in named
    }


class Event(NamedTuple):
    type: str
    reason: str
    message: str


class ClusterObjects:
    """kubectl on one cluster (its ``kubeconfig``): applying objects and reading DDPJobs, their
    Events, pods and logs. :class:`Harness` adds the waits."""

    ns: str = ""  # kubectl's namespace where a call names none ("": kubectl's own default)
    kubectl_timeout_s: float = 120
    _kubeconfig: Path | None = None
    _reads: reads.Reader | None = None

    def __init__(self, kubeconfig: Path, ns: str = "") -> None:
        self._kubeconfig, self.ns = kubeconfig, ns

    @property
    def kubeconfig(self) -> Path:
        assert self._kubeconfig is not None, "no cluster yet"
        return self._kubeconfig

    # -- kubectl -----------------------------------------------------------------------------
    def kubectl(
        self, *args: str, ns: str | None = None, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        where = self.ns if ns is None else ns
        scope = ("-n", where) if where else ()
        return kubectl(
            self.kubeconfig, *scope, *args, check=check, input=input, timeout=self.kubectl_timeout_s
        )

    def k(
        self, *args: str, ns: str | None = None, input: str | None = None, check: bool = True
    ) -> str:
        """kubectl's output."""
        return self.kubectl(*args, ns=ns, input=input, check=check).stdout

    def get(self, *args: str, ns: str | None = None, check: bool = False) -> dict[str, Any]:
        """``kubectl get ARGS -o json``, parsed; {} where there is nothing (unless ``check``).
        The forms the tests poll with are one GET in this process (:mod:`.reads`); where that
        GET fails, or finds no object and ``check`` wants the error, kubectl runs and says why."""
        where = self.ns if ns is None else ns
        read = reads.route(args, where)
        if read is not None:
            try:
                got = self._reader().get(read)
            except reads.NotReadable:
                pass
            else:
                if got is not None or not check:
                    return got or {}
        out = self.k("get", *args, "-o", "json", ns=ns, check=check)
        return dict(json.loads(out)) if out else {}

    def _reader(self) -> reads.Reader:
        if self._reads is None or self._reads.kubeconfig != self.kubeconfig:
            self._reads = reads.Reader(self.kubeconfig)
        return self._reads

    def apply(self, *docs: dict[str, Any] | str, ns: str | None = None) -> str:
        """``kubectl apply`` of objects, or of YAML text."""
        text = "\n---\n".join(d if isinstance(d, str) else yaml.safe_dump(d) for d in docs)
        return self.k("apply", "-f", "-", ns=ns, input=text)

    def apply_example(
        self,
        *files: str,
        edit: Callable[[dict[str, Any]], None] | None = None,
        ns: str | None = None,
    ) -> str:
        """``kubectl apply`` of files of manifests/examples; ``edit`` may adjust the DDPJob.
        With a DDPJob among them, only the claims a DDPJob names are applied
        (:func:`claims_unused`): every claim a test leaves unused is a volume provisioned
        and deleted for nothing (on kind, two helper pods)."""
        docs = [d for f in files for d in yaml.safe_load_all((EXAMPLES / f).read_text()) if d]
        for d in docs:
            if edit is not None and d["kind"] == KIND:
                edit(d)
        unused = claims_unused(docs)
        return self.apply(*(d for d in docs if id(d) not in unused), ns=ns)

    # -- jobs and pods -----------------------------------------------------------------------
    def job(self, name: str, *, ns: str | None = None) -> dict[str, Any]:
        """The DDPJob, or {} when there is none."""
        return self.get("ddpjob", name, ns=ns)

    def status(self, name: str, *, ns: str | None = None) -> dict[str, Any]:
        return dict(self.job(name, ns=ns).get("status") or {})

    def events(self, name: str, *, ns: str | None = None) -> list[Event]:
        """The Events about object ``name`` (a job's: what the operator said)."""
        selector = f"involvedObject.name={name}"
        items = self.get("events", "--field-selector", selector, ns=ns, check=True)["items"]
        return [Event(e.get("type", ""), e["reason"], e.get("message", "")) for e in items]

    def pods(self, selector: str = "", *, ns: str | None = None) -> dict[str, dict[str, Any]]:
        """Name -> pod, of the pods ``selector`` picks (all without one)."""
        args = ["pods", "-l", selector] if selector else ["pods"]
        return {p["metadata"]["name"]: p for p in self.get(*args, ns=ns, check=True)["items"]}

    def workers(self, job: str, *, ns: str | None = None) -> dict[str, dict[str, Any]]:
        """Name -> pod, of the job's node pods."""
        return self.pods(worker_selector(job), ns=ns)

    def worker_uids(self, job: str, *, ns: str | None = None) -> dict[str, str]:
        """Name -> uid of the job's node pods (which of them were made again)."""
        return {n: p["metadata"]["uid"] for n, p in self.workers(job, ns=ns).items()}

    def logs(self, pod: str, container: str = "", *, ns: str | None = None) -> str:
        where = ["-c", container] if container else []
        return self.k("logs", pod, *where, ns=ns, check=False)

    def pod_containers(self, *, ns: str | None = None) -> list[tuple[str, str]]:
        """(pod, container) of every pod's containers."""
        pods = self.get("pods", ns=ns).get("items", [])
        return [(p["metadata"]["name"], c["name"]) for p in pods for c in p["spec"]["containers"]]


class Harness(ClusterObjects):
    """kubectl and waits on one cluster (its ``kubeconfig``), and what to read when a wait
    failed."""

    timeout_s: float = 60  # until's deadline and phase's stall timeout, unless a call says
    interval_s: float = 0.5
    pod_log_lines: int = 25  # of each container, in diagnostics (0: none, e.g. kwok's pods)

    def __init__(
        self,
        kubeconfig: Path,
        ns: str = "",
        timeout_s: float | None = None,
        interval_s: float | None = None,
    ) -> None:
        super().__init__(kubeconfig, ns)
        if timeout_s is not None:
            self.timeout_s = timeout_s
        if interval_s is not None:
            self.interval_s = interval_s

    # -- waits -------------------------------------------------------------------------------
    def until(
        self,
        what: str,
        probe: Callable[[], T | None],
        timeout_s: float | None = None,
        *,
        ns: str | None = None,
    ) -> T:
        """``probe()`` once it is truthy; after ``timeout_s`` an AssertionError that carries
        the diagnostics of ``ns``."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        return until(what, probe, timeout, self.interval_s, lambda: self.diagnostics(ns))

    def phase(
        self,
        name: str,
        phases: str | Sequence[str],
        stall_s: float | None = None,
        *,
        ns: str | None = None,
        on_status: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Waits until the job's phase is one of ``phases``; its status (each one polled goes
        to ``on_status``). Fails at once when the job Failed and ``phases`` hold no Failed;
        else gives up only when its status has not moved for ``stall_s`` (no new phase, ready
        count or step), so a slow or busy machine is no failure, a stuck job is."""
        wanted = (phases,) if isinstance(phases, str) else tuple(phases)
        last: dict[str, Any] = {}

        def probe() -> dict[str, Any] | None:
            nonlocal last
            last = status = self.status(name, ns=ns)
            if on_status is not None:
                on_status(status)
            if status.get("phase") == "Failed" and "Failed" not in wanted:
                raise AssertionError(f"{name} Failed: {status}\n{self.diagnostics(ns)}")
            return status if status.get("phase") in wanted else None

        def moved() -> object:
            return (
                last.get("phase"),
                last.get("readyNodes"),
                (last.get("progress") or {}).get("step"),
            )

        stall = self.timeout_s if stall_s is None else stall_s
        return until(
            f"{name} {'/'.join(wanted)}",
            probe,
            stall,
            self.interval_s,
            lambda: self.diagnostics(ns),
            progress=moved,
        )

    def replaced(
        self,
        job: str,
        pod: str,
        uid: str,
        what: str = "",
        timeout_s: float | None = None,
        *,
        ns: str | None = None,
    ) -> dict[str, Any]:
        """Waits until the job's node pod ``pod`` is there again with a uid other than ``uid``
        (made again); that pod."""

        def new() -> dict[str, Any] | None:
            p = self.workers(job, ns=ns).get(pod)
            return p if p and p["metadata"]["uid"] != uid else None

        return self.until(what or f"a new {pod}", new, timeout_s, ns=ns)

    def held(
        self, job: str, step: int, timeout_s: float | None = None, *, ns: str | None = None
    ) -> dict[str, Any]:
        """Waits until the job pauses after ``step`` (its spec.trainer.holdAtSteps: see
        :func:`holding_at`); its status. Fails at once when the job ended first."""

        def pausing() -> dict[str, Any] | None:
            status = self.status(job, ns=ns)
            if status.get("phase") in TERMINAL_PHASES:
                raise AssertionError(f"{job} ended before the hold after step {step}: {status}")
            return status if (status.get("progress") or {}).get("heldAtStep") == step else None

        return self.until(f"{job} held after step {step}", pausing, timeout_s, ns=ns)

    # -- when something failed ---------------------------------------------------------------
    def operator_log(self, lines: int = 20) -> str:
        """The tail of the operator's log: each of the chart's replicas' (the leader's and the
        standby's) under a line naming the pod and its machine, or what kubectl said instead."""
        pods = self.get("pods", "-l", "app.kubernetes.io/name=ddp-operator", ns=NAMESPACE)
        parts = []
        for pod in pods.get("items", []):  # one by one: a replica on a lost machine has no log
            name = pod["metadata"]["name"]  # to give, and must not hide the other's
            out = self.kubectl("logs", name, f"--tail={lines}", ns=NAMESPACE, check=False)
            where = pod["spec"].get("nodeName") or "unscheduled"
            parts.append(f"[{name} on {where}]\n{out.stdout or out.stderr.strip()}")
        return "\n".join(parts)

    def diagnostics(self, ns: str | None = None) -> str:
        """What to read when a wait failed: the DDPJobs, pods and claims of ``ns`` (of every
        namespace where there is none), its DDPJobs' YAML, its Events, the operator's log and
        the pods' logs."""
        where = self.ns if ns is None else ns
        every = () if where else ("-A",)
        parts = [
            self.k("get", "ddpj,pods,pvc", "-o", "wide", *every, ns=where, check=False),
            self.k("get", "ddpj", "-o", "yaml", ns=where, check=False)[-6000:] if where else "",
            self.k("get", "events", "--sort-by=.lastTimestamp", *every, ns=where, check=False)[
                -4000:
            ],
            "operator log:\n" + self.operator_log(),
        ]
        lines = self.pod_log_lines if where else 0
        for pod, c in self.pod_containers(ns=where) if lines else ():
            text = self.logs(pod, c, ns=where).splitlines()[-lines:]
            parts.append(f"log of {pod}/{c} (last {lines} lines):\n" + "\n".join(text))
        return "\n".join(parts)
