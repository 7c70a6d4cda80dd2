"""The trainer's settings: one pydantic model, and how defaults, YAML, env and CLI merge.

Imports no torch: the operator reads this model (its field descriptions become
``kubectl explain ddpjob.spec.trainer``) in an image without torch.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from .contract import DEFAULT_METRICS_PORT, ENV_CHECKPOINT_DIR, ENV_TRAINER_CONFIG

BUILTIN_WORKLOADS = ("digits", "charlm", "synthetic")
PLUGIN_PATTERN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
DEFAULT_CHECKPOINT_DIR = "./checkpoints"


class ConfigError(ValueError):
    """Settings a user gave that cannot be used; the message names the field and the fix."""


def _known_workload(value: str) -> str:
    if value in BUILTIN_WORKLOADS or PLUGIN_PATTERN.match(value):
        return value
    raise ValueError(
        f"unknown workload {value!r}: use one of {', '.join(BUILTIN_WORKLOADS)} "
        "or a plugin 'package.module:function'"
    )


# A built-in workload's name or a plugin's ``package.module:function``.
Workload = Annotated[str, AfterValidator(_known_workload)]


class _Settings(BaseModel):
    """A frozen settings model: camelCase keys (field names accepted too), unknown keys refused."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    def to_json_dict(self) -> dict[str, Any]:
        """The settings with camelCase keys, as JSON types (what checkpoints store)."""
        return self.model_dump(mode="json", by_alias=True)


class TrainerConfig(_Settings):
    """Settings of one training run (``spec.trainer`` of a DDPJob)."""

    workload: Workload = Field(
        "digits",
        description="What to train: `digits` (scikit-learn's handwritten digits, a small CNN), "
        "`charlm` (a small GPT-style character model on local text), `synthetic` (random data, "
        "for throughput), or a plugin `package.module:function` that returns the model, "
        "datasets and loss.",
    )
    epochs: int = Field(10, ge=1, description="Passes over the training set.")
    max_steps: int | None = Field(
        None,
        ge=1,
        description="Optional cap on optimizer steps; the LR schedule ends at "
        "min(epochs * stepsPerEpoch, maxSteps).",
    )
    global_batch_size: int = Field(
        64,
        ge=1,
        description="Samples per optimizer step summed over all processes; constant whatever "
        "the world size (the per-process batch and gradient accumulation adapt).",
    )
    micro_batch_size: int | None = Field(
        None,
        ge=1,
        description="Largest batch one process runs forward at once; when its share of the "
        "global batch is larger, gradients are accumulated over several micro-batches. "
        "Unset: the largest per-process batch of the run's first start (kept in its "
        "checkpoints), so a run that shrinks accumulates over more micro-batches instead of "
        "growing the per-process batch past what it has run with.",
    )
    lr: float = Field(3e-3, gt=0, description="Peak learning rate of AdamW (before scaleLr).")
    min_lr: float = Field(
        0.0, ge=0, description="Floor of the cosine decay: the LR at the last step."
    )
    warmup_steps: int = Field(
        10, ge=0, description="Optimizer steps of linear warmup from 0 to the peak LR."
    )
    weight_decay: float = Field(0.01, ge=0, description="AdamW decoupled weight decay.")
    grad_clip_norm: float | None = Field(
        None, gt=0, description="Clip the global gradient norm to this value. Unset: no clipping."
    )
    max_non_finite_steps: int = Field(
        10,
        ge=0,
        description="A step whose loss or gradient norm is not finite (NaN, inf) is skipped: "
        "no optimizer update, the data position and LR schedule go on, a warning and the "
        "counter ddp_trainer_non_finite_steps say so (with amp fp16, the GradScaler's own "
        "skips are not counted). After this many such steps in a row the workers fail (exit "
        "code 3) naming this setting. 0: never fail.",
    )
    amp: Literal["auto", "bf16", "fp16", "off"] = Field(
        "auto",
        description="Mixed precision: `auto` (bf16 autocast on CPU and on CUDA devices with "
        "native bf16, compute capability 8.0 and up; fp16 with a GradScaler on older ones, "
        "where bf16 would be emulated), `bf16`, `fp16` (with a GradScaler), `off`.",
    )
    seed: int = Field(0, ge=0, description="Seed of data order, initial weights and dropout.")
    scale_lr: bool = Field(
        False,
        description="Scale the LR linearly with the global batch: lr * globalBatchSize / "
        "baseBatchSize.",
    )
    base_batch_size: int = Field(
        256, ge=1, description="Reference global batch of scaleLr (the batch `lr` was tuned for)."
    )
    bucket_cap_mb: float = Field(
        25.0, gt=0, description="DDP gradient bucket size in MiB (DDP's bucket_cap_mb)."
    )
    gradient_as_bucket_view: bool = Field(
        True, description="Let gradients alias DDP's communication buckets (saves memory)."
    )
    static_graph: bool = Field(
        False,
        description="Tell DDP the set of used parameters never changes between steps "
        "(enables DDP optimizations). Turned off, with a warning in the log, for a start "
        "whose steps run more than one micro-batch per process (gradient accumulation, e.g. "
        "after the job shrank): DDP's static graph fails there (pytorch/pytorch#143580).",
    )
    compile: bool = Field(
        False,
        description="Run the forward and backward passes through `torch.compile` (DDP's "
        "graph-splitting at its gradient buckets keeps communication overlapped). The first "
        "steps take longer while it compiles. Checkpoints hold the plain model's weights, so a "
        "run may resume with compile switched on or off.",
    )
    data_workers: int | None = Field(
        None,
        ge=0,
        description="Processes per training process that read and batch the training data "
        "ahead of the step (PyTorch DataLoader workers; batches are pinned on CUDA). 0: read in "
        "the training process. Unset: 2 on CUDA, 0 on CPU (where workers would compete with "
        "the training threads for the same cores).",
    )
    prefetch_steps: int = Field(
        2,
        ge=1,
        description="Optimizer steps of batches each data worker prepares ahead (the "
        "DataLoader's prefetch_factor); used when dataWorkers > 0.",
    )
    activation_checkpointing: bool = Field(
        False,
        description="charlm only: recompute each transformer block's activations in the "
        "backward pass (torch.utils.checkpoint), trading compute for memory.",
    )
    checkpoint_every_steps: int = Field(
        100,
        ge=0,
        description="Write a checkpoint every N optimizer steps (0: only at the end and on "
        "SIGTERM).",
    )
    checkpoint_keep: int = Field(3, ge=1, description="Newest checkpoints to keep.")
    log_every_steps: int = Field(
        10, ge=1, description="Log and append to metrics.jsonl every N optimizer steps."
    )
    metrics_port: int = Field(
        DEFAULT_METRICS_PORT,
        ge=0,
        le=65535,
        description="TCP port of the Prometheus endpoint (`/metrics`: step time, samples per "
        "second, loss, learning rate, checkpoints, worker restarts) that the first process of "
        "each node serves; the operator declares it as the container port `metrics`. "
        "0: no endpoint. A port that cannot be bound is logged once; training goes on.",
    )
    evaluate: bool = Field(
        True, description="Evaluate on the test split at the end (loss, and accuracy)."
    )
    eval_max_batches: int = Field(
        50, ge=1, description="At most this many batches of globalBatchSize in the evaluation."
    )
    corpus: str | None = Field(
        None,
        description="charlm: a text file or a folder of `*.py`/`*.txt` files. Unset: the "
        "Python standard library's own source files (nothing is downloaded).",
    )
    corpus_max_bytes: int = Field(
        1_000_000, ge=10_000, description="charlm: read at most this many bytes of the corpus."
    )
    block_size: int = Field(128, ge=8, description="charlm: context length in bytes.")
    n_layer: int = Field(4, ge=1, description="charlm: transformer blocks.")
    n_head: int = Field(4, ge=1, description="charlm: attention heads.")
    n_embd: int = Field(128, ge=8, description="charlm: embedding width.")
    dropout: float = Field(0.0, ge=0, lt=1, description="charlm: dropout probability.")
    synthetic_samples: int = Field(
        8192, ge=1, description="synthetic: samples in the training set."
    )
    synthetic_dim: int = Field(256, ge=1, description="synthetic: input features.")
    synthetic_hidden: int = Field(1024, ge=1, description="synthetic: hidden width of the MLP.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="`auto`: CUDA (NCCL) when available, else CPU (gloo)."
    )
    hold_at_steps: tuple[Annotated[int, Field(ge=1)], ...] = Field(
        (),
        max_length=16,
        description="Pause all ranks after each of these optimizer steps (after its checkpoint, "
        "if one is due) until the file `release-step-NNNNNNNN` (the step, 8 digits) exists in "
        "the checkpoint folder; while paused, status.progress.heldAtStep says so. For tests "
        "and debugging: act on a job at a known step. SIGTERM while paused checkpoints and "
        "exits as usual. The last step pauses after training completed (each rank on its "
        "own; SIGTERM ends the pause). Empty (the default): never pause.",
    )
    pg_timeout_s: int = Field(
        1800,
        ge=1,
        description="Timeout of collectives in seconds while a run starts (joining the process "
        "group, model broadcast, first step after a resume): how long a process waits there "
        "for a slow peer (loading data, reading a checkpoint, compiling) before failing (and "
        "being restarted by torchrun). A peer whose machine is lost is noticed sooner: see "
        "stepTimeoutS.",
    )
    step_timeout_s: int = Field(
        60,
        ge=0,
        description="Timeout of collectives in seconds once every rank has finished its first "
        "step: how long survivors wait for a silent peer (a lost machine sends nothing) before "
        "their workers fail and torchrun re-rendezvouses without it. Longer than the longest "
        "stall of one rank between two steps (rank 0 waits for the previous checkpoint write "
        "before copying the next). At most pgTimeoutS; 0: pgTimeoutS throughout. While a run "
        "starts, how long a rank may give no sign of life (each beats in torchrun's store: a "
        "lost machine stops) before the others fail and re-rendezvous without it; at the end, "
        "how long the other ranks wait for a rank 0 that gives no sign of life while it writes "
        "the final checkpoint and evaluates.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> TrainerConfig:
        if self.min_lr > self.lr:
            raise ValueError(f"minLr ({self.min_lr}) must not exceed lr ({self.lr})")
        if self.n_embd % self.n_head:
            raise ValueError(f"nEmbd ({self.n_embd}) must be divisible by nHead ({self.n_head})")
        return self

    @property
    def steady_timeout_s(self) -> int:
        """The collective timeout once every rank has finished its first step."""
        return min(self.step_timeout_s or self.pg_timeout_s, self.pg_timeout_s)

    @property
    def is_plugin(self) -> bool:
        return self.workload not in BUILTIN_WORKLOADS


def _field_name_by_key() -> dict[str, str]:
    names: dict[str, str] = {}
    for name, field in TrainerConfig.model_fields.items():
        names[name] = name
        names[field.alias or name] = name
        names[name.replace("_", "-")] = name
    return names


def normalize_keys(layer: Mapping[str, Any]) -> dict[str, Any]:
    """Map camelCase, snake_case or kebab-case keys to field names; unknown keys pass through."""
    names = _field_name_by_key()
    return {names.get(key, key): value for key, value in layer.items()}


def merge_layers(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Merge settings layers; a later layer overrides an earlier one key by key."""
    merged: dict[str, Any] = {}
    for layer in layers:
        merged.update(normalize_keys(layer))
    return merged


def _field_label(loc: Sequence[int | str]) -> str:
    fields = TrainerConfig.model_fields
    parts = [
        (fields[str(p)].alias or str(p)) if str(p) in fields else str(p) for p in loc if p != ""
    ]
    return ".".join(parts) or "trainer settings"


def dotted_path(loc: Sequence[int | str]) -> str:
    """A pydantic error location as a path: ``spec.nodes``, ``spec.template.env.0``."""
    return ".".join(str(part) for part in loc)


def validation_message(
    error: ValidationError,
    label: Callable[[Sequence[int | str]], str] = dotted_path,
    *,
    first_only: bool = False,
    tidy: bool = True,
    show_input: bool = False,
    unknown: str = "",
) -> str:
    """A validation error as one line: ``field: problem`` per problem, joined by "; ".

    ``label`` names the field of an error location; ``first_only`` keeps the first problem.
    ``tidy`` drops pydantic's "Value error, " and the field where the problem names it itself
    (a message of a rule on ``spec`` that starts ``spec.minNodes ...``); ``show_input`` adds
    ``(got VALUE)``; ``unknown`` replaces pydantic's words for a field the model does not have.
    """
    items = error.errors()
    parts = []
    for item in items[:1] if first_only else items:
        where, message = label(item["loc"]), str(item["msg"])
        extra = item["type"] == "extra_forbidden"
        if tidy:
            message = message.removeprefix("Value error, ")
        if extra and unknown:
            message = unknown
        if show_input and item["loc"] and not extra and item["type"] != "missing":
            message += f" (got {item.get('input')!r})"
        named = tidy and (not where or message.startswith(f"{where.split('.')[0]}."))
        parts.append(message if named else f"{where}: {message}")
    return "; ".join(parts)


def build_config(*layers: Mapping[str, Any]) -> TrainerConfig:
    """Validate merged layers into a TrainerConfig, or raise ConfigError naming the fields."""
    try:
        return TrainerConfig.model_validate(merge_layers(*layers))
    except ValidationError as error:
        # One problem after another, each naming the camelCase setting and the value given.
        raise ConfigError(
            validation_message(
                error,
                _field_label,
                show_input=True,
                unknown="unknown setting (see `python -m ddp_trainer --help`)",
            )
        ) from None


def parse_env_layer(text: str | None) -> dict[str, Any]:
    """The JSON object of DDP_TRAINER_CONFIG (empty when unset)."""
    if not text or not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{ENV_TRAINER_CONFIG}: not valid JSON ({error})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{ENV_TRAINER_CONFIG}: must be a JSON object of camelCase settings")
    return value


def parse_yaml_layer(text: str, source: str = "--config") -> dict[str, Any]:
    """The mapping of a YAML settings file; a top-level `trainer:` key is unwrapped."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"{source}: not valid YAML ({error})") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: must be a mapping of settings")
    if set(value) == {"trainer"} and isinstance(value["trainer"], dict):
        value = value["trainer"]
    return value


def _cli_type(annotation: Any) -> tuple[Any, bool]:
    """(argparse type, is_bool) of a field annotation."""
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _cli_type(inner[0])
    if origin is Literal:
        return str, False
    if origin is tuple:
        return _int_list, False
    if annotation is bool:
        return bool, True
    return annotation, False


def _int_list(text: str) -> list[int]:
    """A comma-separated list of integers on the command line (empty: none)."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers, e.g. 25,50"
        ) from None


def _optional(parse: Any) -> Any:
    def convert(text: str) -> Any:
        return None if text.lower() in ("none", "null", "") else parse(text)

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def build_arg_parser() -> argparse.ArgumentParser:
    """Argument parser with one flag per setting; unset flags leave lower layers alone."""
    parser = argparse.ArgumentParser(
        prog="python -m ddp_trainer",
        description="Train with PyTorch DDP (run by torchrun, or alone for one process). "
        "Settings, later overriding earlier: defaults < YAML file of --config < env "
        f"{ENV_TRAINER_CONFIG} (JSON object, camelCase keys) < the flags below.",
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument("--config", metavar="YAML", help="YAML file of settings (camelCase keys).")
    parser.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help=f"Folder of checkpoints and metrics.jsonl (env {ENV_CHECKPOINT_DIR}; "
        f"default {DEFAULT_CHECKPOINT_DIR}). Only global rank 0 writes into it.",
    )
    settings = parser.add_argument_group("settings")
    for name, field in TrainerConfig.model_fields.items():
        flag = "--" + name.replace("_", "-")
        kind, is_bool = _cli_type(field.annotation)
        choices = None
        literal = [a for a in typing.get_args(field.annotation) if a is not type(None)]
        if typing.get_origin(field.annotation) is Literal:
            choices = list(literal)
        help_text = f"{field.description} [{field.alias}; default: {field.default}]"
        help_text = help_text.replace("%", "%%")
        if is_bool:
            settings.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, help=help_text
            )
            continue
        parse = _optional(kind) if field.default is None else kind
        settings.add_argument(
            flag,
            dest=name,
            type=parse,
            choices=choices,
            metavar=field.alias.upper() if field.alias else name.upper(),
            help=help_text,
        )
    return parser


def load_settings(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> tuple[TrainerConfig, Path]:
    """Settings and checkpoint folder from defaults < --config YAML < env JSON < CLI flags."""
    environ = os.environ if environ is None else environ
    namespace = vars(build_arg_parser().parse_args(argv))
    yaml_layer: dict[str, Any] = {}
    config_path = namespace.pop("config", None)
    if config_path:
        path = Path(config_path)
        if not path.is_file():
            raise ConfigError(f"--config: no such file {config_path!r}")
        yaml_layer = parse_yaml_layer(path.read_text(), source=config_path)
    checkpoint_dir = namespace.pop("checkpoint_dir", None) or environ.get(
        ENV_CHECKPOINT_DIR, DEFAULT_CHECKPOINT_DIR
    )
    env_layer = parse_env_layer(environ.get(ENV_TRAINER_CONFIG))
    config = build_config(yaml_layer, env_layer, namespace)
    return config, Path(checkpoint_dir)
