"""ddp_trainer: the DDPJob trainer, run by torchrun (or alone) as ``python -m ddp_trainer``.

This package root and :mod:`ddp_trainer.config` import no torch, so the operator can
read the settings model in an image without it.
"""

__version__ = "0.1.0"
