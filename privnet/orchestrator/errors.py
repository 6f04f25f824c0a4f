"""The orchestrator's one exception for a run that cannot finish, apart from the curves and
the Result so that every engine can raise it without importing either."""

from __future__ import annotations


class RunFailed(Exception):
    """The run cannot complete; the message names the agent and the cause."""
