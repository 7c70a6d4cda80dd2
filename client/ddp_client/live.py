"""How ``kubectl ddp watch`` shows a job, without I/O: a line per phase, per reason within a
phase and per progress report (redrawn on a TTY), and the exit code of its outcome."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ddp_api.contract import duration_text, parse_rfc3339
from ddp_api.ddpjob import DDPJobPhase, IncidentKind

EXIT_SUCCEEDED, EXIT_FAILED = 0, 1


def exit_code(phase: str | None) -> int | None:
    """The exit code of ``kubectl ddp watch`` for a phase: 0 Succeeded, 1 Failed, None while
    the job has not finished."""
    if phase == DDPJobPhase.SUCCEEDED:
        return EXIT_SUCCEEDED
    if phase == DDPJobPhase.FAILED:
        return EXIT_FAILED
    return None


# -- the live view of status.progress -----------------------------------------------------------
def bar(done: int, total: int, width: int = 30) -> str:
    filled = min(width, int(width * done / total)) if total > 0 else 0
    return "#" * filled + "-" * (width - filled)


def progress_line(progress: Mapping[str, Any]) -> str:
    """One line of the live view, from a DDPJob's ``status.progress``."""
    step = int(progress.get("step") or 0)
    total = int(progress.get("totalSteps") or 0)
    loss = progress.get("loss")
    sps = progress.get("samplesPerSecond")
    parts = [f"[{bar(step, total)}]", f"epoch {progress.get('epoch', '?')}"]
    parts.append(f"step {step}/{total or '?'}")
    if loss is not None:
        parts.append(f"loss {float(loss):.4f}")
    if sps is not None:
        parts.append(f"{float(sps):6.0f} samples/s")
    parts.append(f"(world size {progress.get('worldSize', '?')})")
    eta = progress.get("estimatedRemainingSeconds")
    if eta is not None:
        parts.append(f"ETA {duration_text(int(eta))}")
    return " ".join(parts)


def incident_line(incident: Mapping[str, Any], per_step: bool = False) -> str:
    """``incident NodeLost at step 40: training again after 31s (step 36, 5 steps redone, 51s
    lost)``; in PerStep mode (``per_step``), where the other replica groups trained on through
    it (no step redone), ``incident Disruption at step 180: the other groups trained on (step
    400 reported after 6s, 0 steps redone, 1.4s lost)``: its seconds are no stop of training
    then; what it cost is its ``lostSeconds``. A lost
    lighthouse stalls every group until its replacement answers, and restarts none:
    ``incident LighthouseLost at step 410: the groups waited for a new lighthouse, none
    restarted (step 560 reported after 10s, 0 steps redone)``. A group that shared a machine
    moved to one that came back: ``incident Rebalance at step 900: a group moved to a machine
    of its own, the others trained on (step 905 reported after 1s, 0 steps redone)``."""
    at = incident.get("atStep")
    where = f" at step {at}" if at is not None else ""
    seconds = incident.get("seconds")
    after = f" after {float(seconds):.0f}s" if seconds is not None else ""
    redone = incident.get("stepsRedone")
    step = f"step {incident.get('resumedStep', '?')}"
    lost = incident.get("lostSeconds")
    cost = f", {lost_text(float(lost))} lost" if lost is not None else ""
    if per_step and redone == 0:
        kind = incident.get("kind")
        went = "the other groups trained on"
        if kind == IncidentKind.LIGHTHOUSE_LOST:
            went = "the groups waited for a new lighthouse, none restarted"
        elif kind == IncidentKind.REBALANCE:
            went = "a group moved to a machine of its own, the others trained on"
        return f"incident {kind}{where}: {went} ({step} reported{after}, 0 steps redone{cost})"
    done = step if redone is None else f"{step}, {redone} steps redone"
    return f"incident {incident.get('kind')}{where}: training again{after} ({done}{cost})"


def lost_text(seconds: float) -> str:
    """``1.4s``, ``51s``, ``2m05s``: an incident's lost training time."""
    return f"{seconds:.1f}s" if seconds < 10 else duration_text(round(seconds))


def outcome_line(job: str, status: Mapping[str, Any]) -> str:
    """``ddpjob charlm Succeeded in 1m31s (start-up 30s; 1 incident, goodput 0.67)``: the last
    line of ``kubectl ddp watch``, with what the job's start-up and its incidents cost."""
    phase = status.get("phase")
    start, end = parse_rfc3339(status.get("startTime")), parse_rfc3339(status.get("completionTime"))
    took = f" in {duration_text(round((end - start).total_seconds()))}" if start and end else ""
    reason = status.get("reason")
    why = f": {reason}" if phase == DDPJobPhase.FAILED and reason else ""
    costs = []
    first = parse_rfc3339(status.get("firstReportTime"))
    if start and first and first >= start:
        costs.append(f"start-up {duration_text(round((first - start).total_seconds()))}")
    count = len(status.get("incidents") or [])
    goodput = status.get("goodput")
    if goodput is not None:
        costs.append(f"{count} incident{'' if count == 1 else 's'}, goodput {goodput:.2f}")
    more = f" ({'; '.join(costs)})" if costs else ""
    return f"ddpjob {job} {phase}{took}{why}{more}"


def said(status: Mapping[str, Any]) -> tuple[str, str]:
    """(reason, message) of the condition of the job's current phase."""
    phase = status.get("phase")
    for c in status.get("conditions") or []:
        if c.get("type") == phase and c.get("status") == "True":
            return c.get("reason") or "", c.get("message") or ""
    return "", ""


class LiveView:
    """Turns the statuses a poller sees into lines: a phase line when the phase changes, a
    reason line when the reason or message of the phase's condition changes within a phase
    (``reason ImagePullFailed: ...``), a progress line when what it shows of
    ``status.progress`` changes (a report that changes only ``updatedAt`` or
    ``lastCheckpoint`` adds none), and an incident line as each incident of
    ``status.incidents`` closes, with what it cost. On a TTY, progress redraws one line."""

    def __init__(self, write: Callable[[str], None], tty: bool = False, indent: str = "  "):
        self.write, self.tty, self.indent = write, tty, indent
        self.phase: str | None = None
        self.said: tuple[str, str] = ("", "")  # the phase's reason and message shown
        self.shown: str | None = None  # the last progress line
        self.lines = 0  # progress lines shown
        self.incidents: set[tuple[str, str]] = set()  # (kind, detectedAt) of those shown
        self._open = False  # a TTY line waiting for its newline

    def _end_line(self) -> None:
        if self._open:
            self.write("\n")
            self._open = False

    def __call__(self, status: Mapping[str, Any]) -> None:
        phase = status.get("phase")
        reason, message = now = said(status)
        if phase and phase != self.phase:
            self._end_line()
            text = message or reason
            self.write(f"{self.indent}phase {phase}" + (f": {text}" if text else "") + "\n")
            self.phase, self.said = phase, now
        elif phase and now != self.said and reason:
            self._end_line()
            self.write(f"{self.indent}reason {reason}" + (f": {message}" if message else "") + "\n")
            self.said = now
        for incident in status.get("incidents") or []:
            key = (str(incident.get("kind")), str(incident.get("detectedAt")))
            if "resumedAt" in incident and key not in self.incidents:
                self.incidents.add(key)
                self._end_line()
                per_step = (status.get("progress") or {}).get("groups") is not None
                self.write(f"{self.indent}{incident_line(incident, per_step)}\n")
        progress = status.get("progress") or {}
        line = progress_line(progress) if progress else None
        if line and line != self.shown:  # a new report that shows nothing new is no new line
            self.shown = line
            self.lines += 1
            if self.tty:
                self.write(f"\r\033[K{self.indent}{line}")
                self._open = True
            else:
                self.write(f"{self.indent}{line}\n")

    def close(self) -> None:
        self._end_line()
