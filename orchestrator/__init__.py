"""orchestrator: async multi-agent orchestration.

An `Agent` runs a `State`, one conversation's record folded from an append-only history.

The private modules sit in one folder per layer, bottom-up; a layer imports only the layers
below it, not even for types (a lower layer owns a protocol instead; tests/test_layers.py checks):

- `_base`: errors, JSON values, messages, replies, stop reasons, links, threads, the sync bridge,
  and the one context variable (`_here`, with the protocol the layers below the run ask it by).
- `_record`: the State and its history: entries, the fold, recording, typed data, the store
  protocols and the one store client.
- `_tooling`: tools, their schema and results, toolsets, permissions, memory.
- `_apps`: reporters, events, the console reporter, approvals.
- `models`: the Model protocol and the providers.
- `_running`: the Agent, its run, the loop, thinking, tool execution, ask, saving, subagents,
  runners.

Above them the public surface: this package, `apps` (runs as a service, over HTTP), `mcp`,
`otel`, `permissions`, `runners`, `testing`, the CLI (`_cli`) and what the CLI and `apps` show
people (`_viewing`: trees, timelines, the viewer page). Public import paths are these; the
folders are private.
"""

import typing as _typing

from ._apps._approvals import aapprove as aapprove
from ._apps._approvals import adeny as adeny
from ._apps._approvals import approve as approve
from ._apps._approvals import awaiting as awaiting
from ._apps._approvals import deny as deny
from ._apps._reporting import Reporter as Reporter
from ._base._errors import AuthError as AuthError
from ._base._errors import CallAbandonedError as CallAbandonedError
from ._base._errors import ChildRunError as ChildRunError
from ._base._errors import ContextTooLongError as ContextTooLongError
from ._base._errors import Issue as Issue
from ._base._errors import LimitReachedError as LimitReachedError
from ._base._errors import OrchestratorError as OrchestratorError
from ._base._errors import OutputError as OutputError
from ._base._errors import ProviderError as ProviderError
from ._base._errors import RateLimitError as RateLimitError
from ._base._errors import StoreConflictError as StoreConflictError
from ._base._errors import StoreDamagedError as StoreDamagedError
from ._base._errors import StoreError as StoreError
from ._base._errors import SubagentDepthError as SubagentDepthError
from ._base._errors import ToolError as ToolError
from ._base._errors import ValidationError as ValidationError
from ._base._json import FrozenDict as FrozenDict
from ._base._json import FrozenList as FrozenList
from ._base._json import JSONValue as JSONValue
from ._base._json import thaw as thaw
from ._base._lazy import lazy_names as _lazy_names
from ._base._limits import Limits as Limits
from ._base._link import Link as Link
from ._base._messages import Block as Block
from ._base._messages import Image as Image
from ._base._messages import Message as Message
from ._base._messages import RawBlock as RawBlock
from ._base._messages import ReasoningBlock as ReasoningBlock
from ._base._messages import TextBlock as TextBlock
from ._base._messages import ToolCall as ToolCall
from ._base._messages import ToolResultBlock as ToolResultBlock
from ._base._reply import Reply as Reply
from ._base._reply import Usage as Usage
from ._base._stopped import AwaitingCall as AwaitingCall
from ._base._stopped import Stopped as Stopped
from ._base._stopped import StoppedByApproval as StoppedByApproval
from ._base._stopped import StoppedByFinish as StoppedByFinish
from ._base._stopped import StoppedByLimit as StoppedByLimit
from ._base._stopped import StoppedByPermission as StoppedByPermission
from ._base._stopped import StoppedByUntil as StoppedByUntil
from ._record._history import ApprovalEntry as ApprovalEntry
from ._record._history import ApprovalRecord as ApprovalRecord
from ._record._history import AskEntry as AskEntry
from ._record._history import AskRecord as AskRecord
from ._record._history import ContextChange as ContextChange
from ._record._history import ContextChangeEntry as ContextChangeEntry
from ._record._history import ErrorEntry as ErrorEntry
from ._record._history import ExtraDataChange as ExtraDataChange
from ._record._history import ExtraDataEntry as ExtraDataEntry
from ._record._history import HistoryEntry as HistoryEntry
from ._record._history import ModelReplyEntry as ModelReplyEntry
from ._record._history import ModelRequest as ModelRequest
from ._record._history import ModelRequestEntry as ModelRequestEntry
from ._record._history import NoticeEntry as NoticeEntry
from ._record._history import Outcome as Outcome
from ._record._history import PromptEntry as PromptEntry
from ._record._history import RunStart as RunStart
from ._record._history import RunStartEntry as RunStartEntry
from ._record._history import StopEntry as StopEntry
from ._record._history import ToolResultEntry as ToolResultEntry
from ._record._history import UserEntry as UserEntry
from ._record._leases import AsyncRunLeases as AsyncRunLeases
from ._record._prompt import Prompt as Prompt
from ._record._prompt import prompt_difference as prompt_difference
from ._record._snapshot import StateSnapshot as StateSnapshot
from ._record._state import State as State
from ._record._storage import AsyncBatchStore as AsyncBatchStore
from ._record._storage import AsyncFollowable as AsyncFollowable
from ._record._storage import AsyncMemoryBackend as AsyncMemoryBackend
from ._record._storage import AsyncStore as AsyncStore
from ._record._storage import AsyncTreeFollowable as AsyncTreeFollowable
from ._record._storage import BatchStore as BatchStore
from ._record._storage import Followable as Followable
from ._record._storage import MemoryBackend as MemoryBackend
from ._record._storage import StateInfo as StateInfo
from ._record._storage import Store as Store
from ._record._storage import TreeEntry as TreeEntry
from ._record._storage import TreeFollowable as TreeFollowable
from ._record._typed import SchemaSource as SchemaSource
from ._record._typed import merge_lists as merge_lists
from ._record._typed import replace_values as replace_values
from ._running._agent import Agent as Agent
from ._running._loop import Loop as Loop
from ._running._loop import loop as loop
from ._running._loop import waiting_for_user as waiting_for_user
from ._running._subagents import resumed_child as resumed_child
from ._tooling._memory import Memory as Memory
from ._tooling._tools import FunctionTool as FunctionTool
from ._tooling._tools import OutputMapping as OutputMapping
from ._tooling._tools import Tool as Tool
from ._tooling._tools import ToolInputError as ToolInputError
from ._tooling._tools import ToolResult as ToolResult
from ._tooling._tools import ToolSpec as ToolSpec
from ._tooling._tools import tool as tool
from ._tooling._toolsets import Toolset as Toolset

if _typing.TYPE_CHECKING:
    from ._apps._console import ConsoleReporter as ConsoleReporter
    from ._apps._events import EVENT_ADAPTER as EVENT_ADAPTER
    from ._apps._events import ApprovalNeeded as ApprovalNeeded
    from ._apps._events import AwaitingInfo as AwaitingInfo
    from ._apps._events import CallInfo as CallInfo
    from ._apps._events import ChildStarted as ChildStarted
    from ._apps._events import Event as Event
    from ._apps._events import Events as Events
    from ._apps._events import ModelReplied as ModelReplied
    from ._apps._events import RateLimitWaited as RateLimitWaited
    from ._apps._events import Retrying as Retrying
    from ._apps._events import RunEnded as RunEnded
    from ._apps._events import RunStarted as RunStarted
    from ._apps._events import TextDelta as TextDelta
    from ._apps._events import ToolDeferred as ToolDeferred
    from ._apps._events import ToolEnded as ToolEnded
    from ._apps._events import ToolStarted as ToolStarted

# Imported at first use, so a run that needs neither pays for neither: ConsoleReporter imports
# rich, and the event models are pydantic models and one TypeAdapter built at import (their
# module adds ~5 MB to a fresh process that imports `orchestrator`, ~2 MB to a run of the
# default loop).
_LAZY = {"ConsoleReporter": "._apps._console"} | dict.fromkeys(
    (
        "EVENT_ADAPTER",
        "ApprovalNeeded",
        "AwaitingInfo",
        "CallInfo",
        "ChildStarted",
        "Event",
        "Events",
        "ModelReplied",
        "RateLimitWaited",
        "Retrying",
        "RunEnded",
        "RunStarted",
        "TextDelta",
        "ToolDeferred",
        "ToolEnded",
        "ToolStarted",
    ),
    "._apps._events",
)


# What only a store backend needs moved to `stores.backend`, its one public home; the old names
# keep working (and warn) for one release.
_BACKEND = "import it from stores.backend instead (from stores.backend import {})"
_MOVED = {
    "StorageView": ("._record._storage", _BACKEND.format("StorageView")),
    **{
        name: ("._record._state", _BACKEND.format(name))
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
    "AsyncRunLeases",
    "AsyncStore",
    "AsyncTreeFollowable",
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
    "LimitReachedError",
    "Limits",
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
    "Prompt",
    "PromptEntry",
    "ProviderError",
    "RateLimitError",
    "RateLimitWaited",
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
    "TreeEntry",
    "TreeFollowable",
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
    "prompt_difference",
    "replace_values",
    "resumed_child",
    "thaw",
    "tool",
    "waiting_for_user",
)
