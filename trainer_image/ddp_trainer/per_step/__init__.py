"""PerStep mode (``DDPJOB_FAULT_TOLERANCE=PerStep``): each node pod is one torchft replica group
(:mod:`~ddp_trainer.per_step.trainer`); its settings and arithmetic, which import no torch, are
:mod:`~ddp_trainer.per_step.replicas`."""
