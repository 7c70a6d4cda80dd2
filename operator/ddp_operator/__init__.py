"""ddp_operator: the DDPJob API and the operator that runs it, plus the user's ``kubectl ddp``.

Owns the API (:mod:`~ddp_operator.api`; the CRD is generated from it by
:mod:`~ddp_operator.crd`); the controller's pure decisions (:mod:`~ddp_operator.render` what a
job runs, :mod:`~ddp_operator.plan` what to do, :mod:`~ddp_operator.bookkeeping` what to write
when, :mod:`~ddp_operator.queueing` Kueue, :mod:`~ddp_operator.diagnosis` why pods stop,
:mod:`~ddp_operator.reports` rank 0's progress, :mod:`~ddp_operator.metav1` owner references
and condition times) and its I/O shell (:mod:`~ddp_operator.controller`, and its parts
:mod:`~ddp_operator.actions` carrying out a plan, :mod:`~ddp_operator.machines` the Nodes
and their heartbeats, :mod:`~ddp_operator.workloads` the Kueue Workloads,
:mod:`~ddp_operator.trainer_objects` each job's progress ConfigMap and account;
:mod:`~ddp_operator.informer`,
:mod:`~ddp_operator.kube`, :mod:`~ddp_operator.handlers`, :mod:`~ddp_operator.metrics`,
:mod:`~ddp_operator.settings`); and the user's client (:mod:`~ddp_operator.cli`,
:mod:`~ddp_operator.client`, :mod:`~ddp_operator.client_objects`,
:mod:`~ddp_operator.follow`). What it shares with the trainer pods comes from
:mod:`ddp_trainer.contract`; docs/design.md has the map.
"""
