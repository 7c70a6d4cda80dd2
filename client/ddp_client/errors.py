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


class WaitTimeout(DDPError, TimeoutError):
    pass


def one_line(text: str) -> str:
    return " ".join(text.split())
