"""What a run saves and resumes: the train state and random generators
(:mod:`~ddp_trainer.state.train_state`), the checkpoint folder and its files
(:mod:`~ddp_trainer.state.store`; written in the background: :mod:`~ddp_trainer.state.writer`),
the run's checkpoints across ranks
(:mod:`~ddp_trainer.state.checkpoints`) and which settings a resume may change
(:mod:`~ddp_trainer.state.compat`)."""
