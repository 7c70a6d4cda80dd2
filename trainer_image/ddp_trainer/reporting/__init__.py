"""What a run tells: the tally of the loop (:mod:`~ddp_trainer.reporting.tally`), which writes
the run log (:mod:`~ddp_trainer.reporting.run_log`), the DDPJob's progress record
(:mod:`~ddp_trainer.reporting.progress`) and Prometheus metrics
(:mod:`~ddp_trainer.reporting.prometheus`); and the stacks of a step that hangs
(:mod:`~ddp_trainer.reporting.stacks`)."""
