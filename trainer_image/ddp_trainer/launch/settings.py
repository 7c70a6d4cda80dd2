"""What the node supervisor (:mod:`ddp_trainer.launch.supervisor`) reads from torchrun's
arguments and its environment: torchrun's own flags as torchrun reads them, the trainer's
checkpoint folder, the store-loss restarts allowed, the exit barrier, and whether the run is
complete already."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ddp_api.contract import ENV_CHECKPOINT_DIR

if TYPE_CHECKING:
    from ddp_trainer.state.store import Completion

log = logging.getLogger("ddp_trainer.node")

DEFAULT_RESTARTS = 3
ENV_EXIT_BARRIER = "DDPJOB_EXIT_BARRIER_S"
DEFAULT_EXIT_BARRIER_S = 30.0


def torchrun_setting(args: Sequence[str], environ: Any, flag: str) -> str | None:
    """A torchrun flag's value as torchrun reads it: ``--flag=V``/``--flag V`` (either
    spelling) over ``PET_FLAG``."""
    names = {f"--{flag}", f"--{flag.replace('-', '_')}"}
    for i, arg in enumerate(args):
        if arg == "--module" or arg == "-m" or not arg.startswith("-"):
            break  # the training program and its own arguments follow
        name, eq, value = arg.partition("=")
        if name in names:
            return value if eq else (args[i + 1] if i + 1 < len(args) else None)
    value = environ.get("PET_" + flag.upper().replace("-", "_"))
    return str(value) if value is not None else None


def checkpoint_folder(args: Sequence[str], environ: Any) -> str | None:
    """The trainer's checkpoint folder as it reads it: ``--checkpoint-dir`` among the training
    program's arguments, else ``DDPJOB_CHECKPOINT_DIR``."""
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name == "--checkpoint-dir":
            return value if eq else (args[i + 1] if i + 1 < len(args) else None)
    return environ.get(ENV_CHECKPOINT_DIR) or None


def completed(done: Completion | None, run_id: str | None) -> bool:
    """Whether training of this node's run (its ``--rdzv-id``) is complete already."""
    return done is not None and bool(run_id) and done.run_id == run_id


def restarts_allowed(args: Sequence[str], environ: Any) -> int:
    try:
        return max(0, int(torchrun_setting(args, environ, "max-restarts") or DEFAULT_RESTARTS))
    except ValueError:
        return DEFAULT_RESTARTS


def exit_barrier_s(environ: Any) -> float:
    """How long torchrun's agent waits for its peers once its workers finished."""
    try:
        return max(0.0, float(environ.get(ENV_EXIT_BARRIER) or DEFAULT_EXIT_BARRIER_S))
    except ValueError:
        text = environ.get(ENV_EXIT_BARRIER)
        log.warning("%s=%r is not a number; %gs", ENV_EXIT_BARRIER, text, DEFAULT_EXIT_BARRIER_S)
        return DEFAULT_EXIT_BARRIER_S
