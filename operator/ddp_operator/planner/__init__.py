"""The planner, pure reconciliation: (DDPJob, its pods, previous status, now) -> what to do and
the new status.

No I/O: the controller observes, calls :func:`.plan.plan`, and applies the result. Running it
twice on the same observation gives the same answer, so an operator restart at any point
converges.

How a lost pod is counted (once per pod uid, ``status.handledFailures``, so a status written
before the pod's deletion is not counted again after an operator restart; the operator's own
deletions are recorded as handled when it makes them). A node pod that ends Failed, is deleted
by someone else while it runs, or is marked for a disruption is exactly one of:

1. a *disruption*: it carries the condition ``DisruptionTarget`` (status True), which Kubernetes
   sets on a pod it is about to take away: the eviction API (``kubectl drain``), preemption, a
   taint eviction, the pod garbage collector of a lost machine, the kubelet's node-pressure
   eviction. Counted in ``status.disruptions`` as soon as the condition is seen; recreated at
   once; never spends ``backoffLimit``.
2. a *consequence* of the last counted failure or disruption: its pod was created before it and
   fails within :data:`.failures.DISRUPTION_WINDOW_S` of it (the survivors of a lost node),
   or is deleted within :data:`.failures.SAME_DELETION_S` of it (several pods of one drain).
   Recreated, counted nowhere.
3. a *failure*: anything else, a non-zero exit or a deletion that says nothing about why
   (``kubectl delete pod``). Counted in ``status.restarts`` and against ``backoffLimit``. A
   recreated pod that fails again is always a failure, so a crash loop still spends the budget.

A node pod whose end was not seen (running and ready in the last status,
``status.seenRunning``, now gone or ended while being deleted, and not handled: deleted while no
operator replica led, or at once between two looks) is a disruption: why it went is not known,
so it does not spend ``backoffLimit``.

This is what a Kubernetes Job does with ``podFailurePolicy: {rules: [{action: Ignore,
onPodConditions: [{type: DisruptionTarget}]}]}``, plus rule 2, which a Job needs not: its pods
are independent, whereas one lost DDP node takes its peers' workers down with it.

Losing the rendezvous store pod costs nothing: the nodes ride it out (``ddp_trainer.node``
starts torchrun again against the new store; training resumes from the newest checkpoint), so
the operator only recreates it.

A lost machine: a node pod (or the store pod) on a Kubernetes Node whose Ready condition has
been False or Unknown for longer than ``node_lost_grace_s``
(:data:`.lost_machines.NODE_LOST_GRACE_S`), or whose kubelet has not renewed its Lease for that
long (:func:`.lost_machines.silent_machines`: a frozen or cut off machine is silent at once,
whereas kube-controller-manager marks it Unknown only after its node-monitor grace period, 50 s
by default), is deleted at once with grace period 0 (its kubelet cannot confirm a graceful end)
and recreated, which the scheduler places elsewhere; a node pod lost so is a disruption.
Kubernetes itself would evict it only after its ``not-ready``/``unreachable`` toleration, 300 s
by default, and then leave it Terminating for as long as the machine stays away.

The end of a job: once any node pod exits 0 (its torchrun finished training), the job is
complete. Missing node pods are not recreated and the others' failures are not counted; the
pods still running get ``completion_grace_s`` (from the first success's ``finishedAt``) to
finish, then are deleted; the job Succeeds, its message naming the nodes that did not finish.

PerStep mode (``spec.faultTolerance.mode``): each node pod is a torchft replica group and the
job's server pod is a lighthouse (``<job>-lighthouse``) instead of the store. The rules above
hold, with these differences, because one group's loss stops no other: a node pod deleted while
it runs, by anyone, is a disruption (rule 1), not a failure; no failure is the consequence of
another (rule 2 is off), so each failed pod counts; a lost lighthouse is recreated at once, even
during a backoff, and counts nothing (a ``LighthouseLost`` incident); a resize opens no
``Resize`` incident; while ``minGroups`` groups are ready the job stays Running (reason
``GroupsChanging``, or ``NodeLost``); and once rank 0 reported the last step no failure or loss
is counted and no diagnosis fails the job (it completes when a group exits 0). Nothing is ever
deleted but the pod that went: each replacement is of that one pod. The one pod the operator
deletes of its own accord is a group's that shares a machine while a machine it could have had
came back (:mod:`.placement`): one group at a time, counted nowhere (a ``Rebalance`` incident).

What stops a pod (an image that cannot be pulled, a missing claim, no machine that fits, a
missing command, the OOM killer) is read from its status (:func:`.views.problem`) and judged by
:mod:`ddp_operator.diagnosis`; while pods show it, its reason and message replace those of the
phase (one Event when the reason changes), and what cannot heal fails the job: a missing
command at once, the others once a pod showing it is older than
``spec.startupDeadlineSeconds``. An OOM kill is a failure like any other, named while the
job restarts.

One module per policy, asked in this order by :func:`.plan.plan`: :mod:`.progress` (rank 0's
report), :mod:`.lifecycle` (a finished job's TTL, ``spec.suspend``), :mod:`.admission` (Kueue's
queueing states), :mod:`.lifecycle` again (resuming, ``activeDeadlineSeconds``),
:mod:`.lost_machines`, :mod:`.completion`, :mod:`.failures`, :mod:`.stall` (the progress
deadline), :mod:`.problems` (what :mod:`ddp_operator.diagnosis` reads in the pods),
:mod:`.placement` (PerStep: a group moved off a shared machine to one that came back), then
:mod:`.converge` (what to create and delete, and the phase; PerStep's: :mod:`.groups`). Each
only reads the one :class:`.draft.Draft` (and its own arguments) and returns a frozen
:class:`.decision.Decision`, which :meth:`.draft.Draft.apply` applies before the next policy is
asked; a decision with an outcome ends the planning. What a policy counts as it goes (restarts
against ``backoffLimit``, disruptions) it keeps itself and puts the totals in its decision.
:mod:`.views` reads the pods and Nodes they all see, :mod:`.conditions` writes the job's
conditions.
"""
