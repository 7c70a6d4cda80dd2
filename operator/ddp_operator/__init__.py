"""ddp_operator: the operator that runs DDPJobs (the API itself is :mod:`ddp_api.ddpjob`).

Owns the CRD generated from the API (:mod:`~ddp_operator.crd`); the controller's pure
decisions (:mod:`~ddp_operator.render` what a job runs, :mod:`~ddp_operator.planner` what to do,
:mod:`~ddp_operator.bookkeeping` what to write when, :mod:`~ddp_operator.queueing` Kueue,
:mod:`~ddp_operator.diagnosis` why pods stop, :mod:`~ddp_operator.reports` rank 0's
progress) and its I/O shell (:mod:`~ddp_operator.controller`, and its parts
:mod:`~ddp_operator.workqueue` one reconcile of a job at a time and the clock,
:mod:`~ddp_operator.actions` carrying out a plan, :mod:`~ddp_operator.machines` the Nodes
and their heartbeats, :mod:`~ddp_operator.kueue_workloads` the Kueue Workloads,
:mod:`~ddp_operator.trainer_objects` each job's progress ConfigMap and account,
:mod:`~ddp_operator.progress_records` rank 0's reports as received,
:mod:`~ddp_operator.startup` the start-up histograms;
:mod:`~ddp_operator.informer`, :mod:`~ddp_operator.kube`, :mod:`~ddp_operator.handlers`,
:mod:`~ddp_operator.metrics`, :mod:`~ddp_operator.settings`). It imports :mod:`ddp_api` and
nothing of the trainer or the user's client (``tests/unit/test_packages.py``).
"""
