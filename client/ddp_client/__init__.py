"""ddp_client: the user's side of DDPJobs, ``kubectl ddp`` and the typed Python client.

    from ddp_client import DDPClient, ScriptOptions

Owns the command line (:mod:`~ddp_client.cli`); the client (:mod:`~ddp_client.client`), made
of its parts: the connection and its errors (:mod:`~ddp_client.connection`,
:mod:`~ddp_client.errors`), the jobs (:mod:`~ddp_client.jobs`) and the objects it submits
(:mod:`~ddp_client.objects`), the pods that read a job's checkpoint volume
(:mod:`~ddp_client.volume`, running :mod:`~ddp_client.log_dump` for the kept logs), their logs
(:mod:`~ddp_client.logs`) and run logs (:mod:`~ddp_client.run_log`); and, without I/O, how a
job is shown: the live view (:mod:`~ddp_client.live`), merged log lines
(:mod:`~ddp_client.loglines`), the logs kept on the volume (:mod:`~ddp_client.kept_logs`),
loss curves (:mod:`~ddp_client.curves`) and what a pod's status says (:mod:`~ddp_client.pod_state`).
It reaches a cluster through the Kubernetes API only and shares nothing with the operator
but :mod:`ddp_api`; ``pip install '.[client]'`` installs these two packages and no other
(not the operator, the trainer or the development harness).
"""

from .client import DDPClient
from .curves import Plot, draw_curves
from .errors import (
    ClusterUnreachable,
    DDPError,
    JobNotFound,
    NoKeptLogs,
    NoMetrics,
    ScriptNotFound,
    WaitTimeout,
)
from .jobs import read_script, status_of
from .objects import ScriptOptions

__all__ = [
    "ClusterUnreachable",
    "DDPClient",
    "DDPError",
    "JobNotFound",
    "NoKeptLogs",
    "NoMetrics",
    "Plot",
    "ScriptNotFound",
    "ScriptOptions",
    "WaitTimeout",
    "draw_curves",
    "read_script",
    "status_of",
]
