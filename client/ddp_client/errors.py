"""The errors of the client: each is one line that says what is wrong and what to do."""

from __future__ import annotations


class DDPError(Exception):
    """A failure the user can act on; its text is one line that says what is wrong."""


class JobNotFound(DDPError):
    pass


class ClusterUnreachable(DDPError):
    pass


class ScriptNotFound(DDPError):
    pass


class NoMetrics(DDPError):
    pass


class NoKeptLogs(DDPError):
    pass


class ApiError(DDPError):
    """The API server answered with an error; ``status`` is its HTTP status."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status

    @property
    def passing(self) -> bool:
        """Whether a server that just answered well may answer so while it restarts: 401 and
        403 until its authorizers have synced (seen on kind, a machine of the control plane
        powered off and on), 429 and 5xx while it comes up or is overloaded."""
        return self.status in (401, 403, 429) or self.status >= 500


class WaitTimeout(DDPError, TimeoutError):
    pass


def one_line(text: str) -> str:
    return " ".join(text.split())
