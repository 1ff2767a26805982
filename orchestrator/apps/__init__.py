"""Agents in apps: runs as a service an app owns (`Runs`).

``async with Runs(agents, store) as runs:`` in an app's lifespan starts, cancels and decides
runs by id; each run is a task of the service, saved as it goes.
"""

from ._runs import DEFAULT_MAX_RUNS as DEFAULT_MAX_RUNS
from ._runs import RunHandle as RunHandle
from ._runs import RunInfo as RunInfo
from ._runs import Runs as Runs
from ._runs import RunStatus as RunStatus
from ._runs import TooManyRunsError as TooManyRunsError

__all__ = ("DEFAULT_MAX_RUNS", "RunHandle", "RunInfo", "RunStatus", "Runs", "TooManyRunsError")
