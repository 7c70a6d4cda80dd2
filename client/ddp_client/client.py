"""A typed Python client for DDPJobs: create one from a script or a spec, wait for it, stream
its nodes' merged logs, read its progress and the curves of its ``metrics.jsonl``.

    from ddp_client import DDPClient, ScriptOptions

    ddp = DDPClient(namespace="team")  # $KUBECONFIG (or ~/.kube/config), else in-cluster
    name = ddp.submit_script("train.py", ScriptOptions(nodes=2, nproc_per_node=4))
    status = ddp.wait(name, timeout_s=3600, on_status=lambda s: print(s.phase))
    for line in ddp.logs(name, rank=0):
        print(line.show())  # [node-0 rank0] ...
    print(status.phase, ddp.progress(name))
    ddp.plot(name, "loss.png")  # needs spec.checkpoint: metrics.jsonl is read from there

``kubectl ddp`` (:mod:`ddp_client.cli`) is this client with a command line. Install both
with ``pip install '.[client]'``. Every error a user can cause is a :class:`DDPError` whose
text is one line that says what to do.
"""

from __future__ import annotations

from .run_log import RunLogReader


class DDPClient(RunLogReader):
    """DDPJobs of one namespace of one cluster, through the Kubernetes API only (so it works
    on any cluster). ``namespace`` defaults to the kubeconfig context's, else ``default``.

    Its parts, each in its own module: the connection and its errors (``connection``), the
    jobs (``jobs``), their logs (``logs``) and their run logs and curves (``run_log``)."""
