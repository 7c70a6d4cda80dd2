"""ddp_trainer: the DDPJob trainer, run by torchrun (or alone) as ``python -m ddp_trainer``.

Owns what runs in a job's pods: the training loop (:mod:`~ddp_trainer.trainer` and the parts,
state, checkpoints, batching, sampler, schedule, precision, workloads and hold points it is
built from), the node wrapper around torchrun (:mod:`~ddp_trainer.node`) and the job's
rendezvous store (:mod:`~ddp_trainer.rdzv_store`), and what it reports
(:mod:`~ddp_trainer.progress`: the run log ``metrics.jsonl`` and the progress record;
:mod:`~ddp_trainer.metrics`: Prometheus). It also owns :mod:`~ddp_trainer.contract`, what the
operator and the trainer agree on, because the trainer image cannot import the operator.

This package root, :mod:`ddp_trainer.contract`, :mod:`ddp_trainer.config` and
:mod:`ddp_trainer.progress` import no torch, so the operator can read them in an image
without it.
"""

__version__ = "0.1.0"
