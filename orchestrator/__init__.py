"""orchestrator: async multi-agent orchestration.

An `Agent` runs a `State`, one conversation's record folded from an append-only history.
"""

import typing as _typing

from ._agent import Agent as Agent
from ._approvals import aapprove as aapprove
from ._approvals import adeny as adeny
from ._approvals import approve as approve
from ._approvals import awaiting as awaiting
from ._approvals import deny as deny
from ._errors import AuthError as AuthError
from ._errors import CallAbandonedError as CallAbandonedError
from ._errors import ChildRunError as ChildRunError
from ._errors import ContextTooLongError as ContextTooLongError
from ._errors import Issue as Issue
from ._errors import OrchestratorError as OrchestratorError
from ._errors import OutputError as OutputError
from ._errors import ProviderError as ProviderError
from ._errors import RateLimitError as RateLimitError
from ._errors import StoreConflictError as StoreConflictError
from ._errors import StoreDamagedError as StoreDamagedError
from ._errors import StoreError as StoreError
from ._errors import SubagentDepthError as SubagentDepthError
from ._errors import ToolError as ToolError
from ._errors import ValidationError as ValidationError
from ._history import ApprovalEntry as ApprovalEntry
from ._history import ApprovalRecord as ApprovalRecord
from ._history import AskEntry as AskEntry
from ._history import AskRecord as AskRecord
from ._history import ContextChange as ContextChange
from ._history import ContextChangeEntry as ContextChangeEntry
from ._history import ErrorEntry as ErrorEntry
from ._history import ExtraDataChange as ExtraDataChange
from ._history import ExtraDataEntry as ExtraDataEntry
from ._history import HistoryEntry as HistoryEntry
from ._history import ModelReplyEntry as ModelReplyEntry
from ._history import ModelRequest as ModelRequest
from ._history import ModelRequestEntry as ModelRequestEntry
from ._history import NoticeEntry as NoticeEntry
from ._history import Outcome as Outcome
from ._history import RunStart as RunStart
from ._history import RunStartEntry as RunStartEntry
from ._history import StopEntry as StopEntry
from ._history import ToolResultEntry as ToolResultEntry
from ._history import UserEntry as UserEntry
from ._json import FrozenDict as FrozenDict
from ._json import FrozenList as FrozenList
from ._json import JSONValue as JSONValue
from ._json import thaw as thaw
from ._lazy import lazy_names as _lazy_names
from ._link import Link as Link
from ._loop import Loop as Loop
from ._loop import loop as loop
from ._loop import waiting_for_user as waiting_for_user
from ._memory import Memory as Memory
from ._messages import Block as Block
from ._messages import Image as Image
from ._messages import Message as Message
from ._messages import RawBlock as RawBlock
from ._messages import ReasoningBlock as ReasoningBlock
from ._messages import TextBlock as TextBlock
from ._messages import ToolCall as ToolCall
from ._messages import ToolResultBlock as ToolResultBlock
from ._reply import Reply as Reply
from ._reply import Usage as Usage
from ._reporting import Reporter as Reporter
from ._snapshot import StateSnapshot as StateSnapshot
from ._state import State as State
from ._stopped import AwaitingCall as AwaitingCall
from ._stopped import Stopped as Stopped
from ._stopped import StoppedByApproval as StoppedByApproval
from ._stopped import StoppedByFinish as StoppedByFinish
from ._stopped import StoppedByLimit as StoppedByLimit
from ._stopped import StoppedByPermission as StoppedByPermission
from ._stopped import StoppedByUntil as StoppedByUntil
from ._storage import AsyncBatchStore as AsyncBatchStore
from ._storage import AsyncFollowable as AsyncFollowable
from ._storage import AsyncMemoryBackend as AsyncMemoryBackend
from ._storage import AsyncStore as AsyncStore
from ._storage import BatchStore as BatchStore
from ._storage import Followable as Followable
from ._storage import MemoryBackend as MemoryBackend
from ._storage import StateInfo as StateInfo
from ._storage import Store as Store
from ._subagents import resumed_child as resumed_child
from ._tools import FunctionTool as FunctionTool
from ._tools import OutputMapping as OutputMapping
from ._tools import Tool as Tool
from ._tools import ToolInputError as ToolInputError
from ._tools import ToolResult as ToolResult
from ._tools import ToolSpec as ToolSpec
from ._tools import tool as tool
from ._toolsets import Toolset as Toolset
from ._typed import SchemaSource as SchemaSource
from ._typed import merge_lists as merge_lists
from ._typed import replace_values as replace_values

if _typing.TYPE_CHECKING:
    from ._console import ConsoleReporter as ConsoleReporter
    from ._events import EVENT_ADAPTER as EVENT_ADAPTER
    from ._events import ApprovalNeeded as ApprovalNeeded
    from ._events import AwaitingInfo as AwaitingInfo
    from ._events import CallInfo as CallInfo
    from ._events import ChildStarted as ChildStarted
    from ._events import Event as Event
    from ._events import Events as Events
    from ._events import ModelReplied as ModelReplied
    from ._events import Retrying as Retrying
    from ._events import RunEnded as RunEnded
    from ._events import RunStarted as RunStarted
    from ._events import TextDelta as TextDelta
    from ._events import ToolDeferred as ToolDeferred
    from ._events import ToolEnded as ToolEnded
    from ._events import ToolStarted as ToolStarted

# Imported at first use, so a run that needs neither pays for neither: ConsoleReporter imports
# rich, and the event models are pydantic models and one TypeAdapter built at import (their
# module adds ~5 MB to a fresh process that imports `orchestrator`, ~2 MB to a run of the
# default loop).
_LAZY = {"ConsoleReporter": "._console"} | dict.fromkeys(
    (
        "EVENT_ADAPTER",
        "ApprovalNeeded",
        "AwaitingInfo",
        "CallInfo",
        "ChildStarted",
        "Event",
        "Events",
        "ModelReplied",
        "Retrying",
        "RunEnded",
        "RunStarted",
        "TextDelta",
        "ToolDeferred",
        "ToolEnded",
        "ToolStarted",
    ),
    "._events",
)


# What only a store backend needs moved to `stores.backend`, its one public home; the old names
# keep working (and warn) for one release.
_BACKEND = "import it from stores.backend instead (from stores.backend import {})"
_MOVED = {
    "StorageView": ("._storage", _BACKEND.format("StorageView")),
    **{
        name: ("._state", _BACKEND.format(name))
        for name in ("bind_state", "recover_state", "storage_view", "validate_id")
    },
}

__getattr__: _typing.Callable[[str], _typing.Any] = _lazy_names(__name__, _LAZY, _MOVED)


__all__ = (
    "EVENT_ADAPTER",
    "Agent",
    "ApprovalEntry",
    "ApprovalNeeded",
    "ApprovalRecord",
    "AskEntry",
    "AskRecord",
    "AsyncBatchStore",
    "AsyncFollowable",
    "AsyncMemoryBackend",
    "AsyncStore",
    "AuthError",
    "AwaitingCall",
    "AwaitingInfo",
    "BatchStore",
    "Block",
    "CallAbandonedError",
    "CallInfo",
    "ChildRunError",
    "ChildStarted",
    "ConsoleReporter",
    "ContextChange",
    "ContextChangeEntry",
    "ContextTooLongError",
    "ErrorEntry",
    "Event",
    "Events",
    "ExtraDataChange",
    "ExtraDataEntry",
    "Followable",
    "FrozenDict",
    "FrozenList",
    "FunctionTool",
    "HistoryEntry",
    "Image",
    "Issue",
    "JSONValue",
    "Link",
    "Loop",
    "Memory",
    "MemoryBackend",
    "Message",
    "ModelReplied",
    "ModelReplyEntry",
    "ModelRequest",
    "ModelRequestEntry",
    "NoticeEntry",
    "OrchestratorError",
    "Outcome",
    "OutputError",
    "OutputMapping",
    "ProviderError",
    "RateLimitError",
    "RawBlock",
    "ReasoningBlock",
    "Reply",
    "Reporter",
    "Retrying",
    "RunEnded",
    "RunStart",
    "RunStartEntry",
    "RunStarted",
    "SchemaSource",
    "State",
    "StateInfo",
    "StateSnapshot",
    "StopEntry",
    "Stopped",
    "StoppedByApproval",
    "StoppedByFinish",
    "StoppedByLimit",
    "StoppedByPermission",
    "StoppedByUntil",
    "Store",
    "StoreConflictError",
    "StoreDamagedError",
    "StoreError",
    "SubagentDepthError",
    "TextBlock",
    "TextDelta",
    "Tool",
    "ToolCall",
    "ToolDeferred",
    "ToolEnded",
    "ToolError",
    "ToolInputError",
    "ToolResult",
    "ToolResultBlock",
    "ToolResultEntry",
    "ToolSpec",
    "ToolStarted",
    "Toolset",
    "Usage",
    "UserEntry",
    "ValidationError",
    "aapprove",
    "adeny",
    "approve",
    "awaiting",
    "deny",
    "loop",
    "merge_lists",
    "replace_values",
    "resumed_child",
    "thaw",
    "tool",
    "waiting_for_user",
)
