"""ddp_api: what the operator, the trainer and the user's client agree on, written once.

Owns the DDPJob API (:mod:`~ddp_api.ddpjob`, from which the CRD is generated), the trainer's
settings (:mod:`~ddp_api.trainer_config`, which spec.trainer is validated against), the
contract between operator and trainer pods (:mod:`~ddp_api.contract`: names, environment,
ports, timestamps, the run log), what a job's pods are called and carry (:mod:`~ddp_api.pods`)
and Kubernetes' owner and condition rules (:mod:`~ddp_api.metav1`). It imports pydantic and
pyyaml only: no torch, no Kubernetes client, so every program can import it.
"""
