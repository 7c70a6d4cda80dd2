"""A job's run log (``metrics.jsonl`` on its checkpoint volume), read by a short-lived pod
through its log so that it works on any cluster, and drawn (``kubectl ddp plot``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddp_api.contract import RUN_LOG_FILE, parse_run_log

from .curves import Plot, curves, draw_curves
from .errors import NoMetrics
from .logs import Logs
from .objects import InvalidJob, metrics_reader_pod, reader_image


class RunLogReader(Logs):
    """Reads a job's run log and draws its curves."""

    def metrics(
        self, name: str, *, image: str | None = None, timeout_s: float = 180.0
    ) -> list[dict[str, Any]]:
        """The lines of the job's metrics.jsonl, read from its checkpoint volume by a
        short-lived pod (see :func:`~ddp_client.objects.metrics_reader_pod`) through
        its log, so that it works on any cluster. ``image`` overrides the job's image."""
        job = self.get(name)
        try:
            manifest = metrics_reader_pod(job, image or reader_image(job, self._workers(name)))
        except InvalidJob as error:
            raise NoMetrics(str(error)) from None
        text = self._read_volume(name, manifest, RUN_LOG_FILE, NoMetrics, timeout_s)
        return parse_run_log(text)

    def plot(
        self,
        name: str,
        path: str | Path,
        *,
        image: str | None = None,
        timeout_s: float = 180.0,
    ) -> Plot:
        """Draws the job's loss and learning rate by step (from metrics.jsonl) to ``path``."""
        found = curves(self.metrics(name, image=image, timeout_s=timeout_s))
        if found.empty:
            raise NoMetrics(f"ddpjob {name}'s metrics.jsonl has no step lines yet")
        return draw_curves(found, path, title=f"DDPJob {name}")
