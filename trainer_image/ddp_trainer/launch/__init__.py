"""What starts the training processes: the node supervisor around torchrun
(:mod:`~ddp_trainer.launch.supervisor`: its settings, :mod:`~ddp_trainer.launch.settings`; the
pod's kept log, :mod:`~ddp_trainer.launch.keptlog`; the store's identity,
:mod:`~ddp_trainer.launch.store_probe`; its workers forked warm,
:mod:`~ddp_trainer.launch.warm`). None of them imports torch at import time."""
