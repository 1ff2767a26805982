"""Apps: runs as a service, and the UI protocols they speak.

Durable events (the events a stored history stands for, with ids a reconnect can name) are
here. The protocol adapters are modules of their own, imported by name:
`orchestrator.apps.agui` (AG-UI, needs ``pip install 'orchestrator[apps]'``) and
`orchestrator.apps.vercel` (the Vercel AI SDK UI message stream).
"""

from .._apps._durable import LIVE_ONLY as LIVE_ONLY
from .._apps._durable import DurableEvent as DurableEvent
from .._apps._durable import EventId as EventId
from .._apps._durable import HistoryEvents as HistoryEvents
from .._apps._durable import Progress as Progress
from .._apps._durable import durable_events as durable_events
from .._apps._durable import history_events as history_events

__all__ = (
    "LIVE_ONLY",
    "DurableEvent",
    "EventId",
    "HistoryEvents",
    "Progress",
    "durable_events",
    "history_events",
)
