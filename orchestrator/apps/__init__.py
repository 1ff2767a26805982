"""Apps: runs as a service, and the UI protocols they speak.

``async with Runs(agents, store) as runs:`` in an app's lifespan starts, cancels and decides
runs by id; each run is a task of the service, saved as it goes. Durable events (the events a
stored history stands for, with ids a reconnect can name) are here too. The protocol adapters
are modules of their own, imported by name: `orchestrator.apps.agui` (AG-UI, needs
``pip install 'orchestrator[apps]'``) and `orchestrator.apps.vercel` (the Vercel AI SDK UI
message stream).
"""

import typing as _typing

from .._apps._durable import LIVE_ONLY as LIVE_ONLY
from .._apps._durable import DurableEvent as DurableEvent
from .._apps._durable import EventId as EventId
from .._apps._durable import HistoryEvents as HistoryEvents
from .._apps._durable import Progress as Progress
from .._apps._durable import durable_events as durable_events
from .._apps._durable import history_events as history_events
from .._base._lazy import lazy_names as _lazy_names
from ._following import Followed as Followed
from ._following import Following as Following
from ._runs import DEFAULT_MAX_RUNS as DEFAULT_MAX_RUNS
from ._runs import RunHandle as RunHandle
from ._runs import RunInfo as RunInfo
from ._runs import Runs as Runs
from ._runs import RunStatus as RunStatus
from ._runs import TooManyRunsError as TooManyRunsError

if _typing.TYPE_CHECKING:
    from ._asgi import DEFAULT_HOSTS as DEFAULT_HOSTS
    from ._asgi import DEFAULT_MAX_BODY as DEFAULT_MAX_BODY
    from ._asgi import SESSION_COOKIE as SESSION_COOKIE
    from ._asgi import asgi_app as asgi_app
    from ._asgi import run_json as run_json

# Imported at first use: the HTTP app needs Starlette (``pip install 'orchestrator[apps]'``).
__getattr__: _typing.Callable[[str], _typing.Any] = _lazy_names(
    __name__,
    {
        "DEFAULT_HOSTS": "._asgi",
        "DEFAULT_MAX_BODY": "._asgi",
        "SESSION_COOKIE": "._asgi",
        "asgi_app": "._asgi",
        "run_json": "._asgi",
    },
)

__all__ = (
    "DEFAULT_HOSTS",
    "DEFAULT_MAX_BODY",
    "DEFAULT_MAX_RUNS",
    "LIVE_ONLY",
    "SESSION_COOKIE",
    "DurableEvent",
    "EventId",
    "Followed",
    "Following",
    "HistoryEvents",
    "Progress",
    "RunHandle",
    "RunInfo",
    "RunStatus",
    "Runs",
    "TooManyRunsError",
    "asgi_app",
    "durable_events",
    "history_events",
    "run_json",
)
