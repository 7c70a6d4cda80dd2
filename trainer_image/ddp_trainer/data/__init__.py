"""The data: workloads (model, datasets, loss; :mod:`~ddp_trainer.data.workloads`), the global
order (:mod:`~ddp_trainer.data.sampler`), each step's batch and each rank's share of it
(:mod:`~ddp_trainer.data.batching`), loading (:mod:`~ddp_trainer.data.loader`) and loss
weighting (:mod:`~ddp_trainer.data.weighting`)."""
