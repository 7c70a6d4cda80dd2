"""ddp_trainer: the DDPJob trainer, run by torchrun (or alone) as ``python -m ddp_trainer``.

Owns what runs in a job's pods. Its commands: ``python -m ddp_trainer`` (a training process)
and ``python -m ddp_trainer.node`` (a node pod: torchrun under
:mod:`~ddp_trainer.launch.supervisor`); the job's rendezvous store pod runs
:mod:`ddp_api.rdzv_store`, which needs only torch. Its parts:

- the training loop, :mod:`~ddp_trainer.trainer`, and what it calls at the top level:
  :mod:`~ddp_trainer.parts` (model, optimizer, batches), :mod:`~ddp_trainer.step` (one
  optimizer step's pieces), :mod:`~ddp_trainer.ending` (how a run ends),
  :mod:`~ddp_trainer.distributed`, :mod:`~ddp_trainer.amp`,
  :mod:`~ddp_trainer.schedule` and :mod:`~ddp_trainer.hold`; PerStep mode's replica groups are
  :mod:`~ddp_trainer.per_step`;
- :mod:`~ddp_trainer.data`: workloads, the data order, batching, loading and loss weighting;
- :mod:`~ddp_trainer.state`: the train state, checkpoint files, the run's checkpoints and resume
  compatibility;
- :mod:`~ddp_trainer.reporting`: the tally, the run log ``metrics.jsonl``, the progress record,
  Prometheus and the stack dumps of a hung step;
- :mod:`~ddp_trainer.launch`: the node supervisor around torchrun, its kept log and the
  rendezvous store.

What it agrees on with the operator and the client (the contract, its own settings, the API) is
:mod:`ddp_api`.
"""

__version__ = "0.1.0"
