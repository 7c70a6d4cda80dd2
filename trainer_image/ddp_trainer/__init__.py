"""ddp_trainer: the DDPJob trainer, run by torchrun (or alone) as ``python -m ddp_trainer``.

Owns what runs in a job's pods: the training loop (:mod:`~ddp_trainer.trainer` and the parts,
state, checkpoints, checkpointing, tally, ending, distributed, batching, sampler, loader,
schedule, precision, workloads and hold points it is built from), the node wrapper around
torchrun (:mod:`~ddp_trainer.node`, which keeps its pod's log on the checkpoint volume:
:mod:`~ddp_trainer.keptlog`) and the job's rendezvous store
(:mod:`~ddp_trainer.rdzv_store`), and what it reports
(:mod:`~ddp_trainer.progress`: the run log ``metrics.jsonl`` and the progress record;
:mod:`~ddp_trainer.metrics`: Prometheus). What it agrees on with the operator and the client
(the contract, its own settings, the API) is :mod:`ddp_api`.
"""

__version__ = "0.1.0"
