"""What starts the training processes: the node supervisor around torchrun
(:mod:`~ddp_trainer.launch.supervisor`, which keeps its pod's log:
:mod:`~ddp_trainer.launch.keptlog`, and watches the store: :mod:`~ddp_trainer.launch.store_probe`)
and the job's rendezvous store (:mod:`~ddp_trainer.launch.rdzv_store`). Imports no torch at import
time."""
