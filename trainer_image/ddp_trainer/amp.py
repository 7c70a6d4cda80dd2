"""Which mixed precision to use, decided once from the setting and the device (pure)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Precision:
    """Autocast dtype name (None: full precision) and whether a GradScaler is needed."""

    dtype: str | None
    grad_scaler: bool

    @property
    def label(self) -> str:
        if self.dtype is None:
            return "fp32"
        return f"{self.dtype}+GradScaler" if self.grad_scaler else self.dtype


def resolve_amp(mode: str, device_type: str, bf16_supported: bool) -> Precision:
    """`auto`: bf16 on CPU and on CUDA devices that support it, else fp16 with a GradScaler."""
    if mode == "off":
        return Precision(None, False)
    if mode == "bf16":
        return Precision("bfloat16", False)
    if mode == "fp16":
        return Precision("float16", True)
    if mode == "auto":
        if device_type == "cpu" or bf16_supported:
            return Precision("bfloat16", False)
        return Precision("float16", True)
    raise ValueError(f"amp: unknown mode {mode!r} (use auto, bf16, fp16 or off)")
