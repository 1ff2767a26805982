"""History entries: the frozen records a State is folded from.

Every entry has `kind` (which class it is, so type checkers narrow `content`), `content`, `turn`
(the turn it belongs to), `at` (UTC, left out of ``==``) and `seq` (its 0-based position).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, TypeAlias

from .._base._json import FrozenList, freeze, freeze_values, valid_fields
from .._base._limits import Limits
from .._base._messages import Message, ToolCall, ToolResultBlock
from .._base._reply import Reply, Usage
from .._base._stopped import AnyStopped
from ._prompt import Prompt

__all__ = (
    "ApprovalEntry",
    "ApprovalRecord",
    "AskEntry",
    "AskRecord",
    "ContextChange",
    "ContextChangeEntry",
    "ErrorEntry",
    "ExtraDataChange",
    "ExtraDataEntry",
    "HistoryEntry",
    "ModelReplyEntry",
    "ModelRequest",
    "ModelRequestEntry",
    "NoticeEntry",
    "Outcome",
    "PromptEntry",
    "RunStart",
    "RunStartEntry",
    "StopEntry",
    "ToolResultEntry",
    "UserEntry",
)

Outcome: TypeAlias = Literal[
    "done", "error", "input_error", "denied", "cancelled", "interrupted", "aborted", "unknown"
]
OUTCOMES: frozenset[str] = frozenset(Outcome.__args__)  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextChange:
    """What changed the context: an import, a compaction, cleared tool results or a restore.

    A compaction written by the model (`agent.compact`) names the prompt its request used,
    as a `ModelRequest` does (`prompt`, `prompt_holder`); None for the other kinds.
    """

    kind: Literal["import", "compact", "clear_tool_results", "restore"]
    messages: tuple[Message, ...] = ()
    summary: str | None = None
    keep_last: int | None = None
    restored_to: int | None = None
    covered: int | None = None  # a compaction's summary covers this many messages (None: all)
    usage: Usage = field(default_factory=Usage)
    prompt: str | None = None
    prompt_holder: str | None = None

    def __post_init__(self) -> None:
        valid_fields(self, "summary", "prompt", "prompt_holder")


@dataclass(frozen=True, slots=True, kw_only=True)
class ExtraDataChange:
    """Keys of `extra_data` given new values (`changed`) and keys removed (`removed`).

    `turn_merge` marks the entry that merges the state updates of the turn that just closed
    (its results marked `merge_due`), recorded by the agent that has the tools' handlers.
    """

    changed: Mapping[str, Any] = field(default_factory=dict[str, Any])
    removed: Sequence[str] = ()
    turn_merge: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "changed", freeze_values(self.changed, "extra_data"))
        object.__setattr__(self, "removed", FrozenList(self.removed))


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStart:
    """A run began: who started it (`parent_id`, `parent_call_id`) and with which agent.

    `limits` are the limits the run was given (its agent's and its call's, the tighter of
    each; None: none), so whoever continues it later (a decision taken in another process)
    can continue it under the same limits.
    """

    parent_id: str | None = None
    parent_call_id: str | None = None
    agent: str | None = None
    model: str | None = None
    tools: tuple[str, ...] = ()
    limits: Limits | None = None

    def __post_init__(self) -> None:
        valid_fields(self, "parent_id", "parent_call_id", "agent", "model", "tools")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRequest:
    """A request was sent to `model` with `message_count` messages.

    `prompt` is the digest of the `Prompt` it used (None: not recorded, as in histories
    written before prompts were). The prompt is recorded before it in the same history, or,
    when `prompt_holder` names a State, in the history of that State of the same tree (an
    ancestor or an earlier sibling that used it first): a tree stores each prompt once.
    """

    model: str | None = None
    message_count: int = 0
    prompt: str | None = None
    prompt_holder: str | None = None

    def __post_init__(self) -> None:
        valid_fields(self, "model", "prompt", "prompt_holder")


@dataclass(frozen=True, slots=True, kw_only=True)
class AskRecord:
    """An `agent.ask` that was answered: the question, the answer (JSON) and what it cost.

    `prompt` and `prompt_holder` name the prompt its requests used, as a `ModelRequest` does
    (None: not recorded, as in histories written before asks recorded theirs).
    """

    question: str
    answer: Any
    usage: Usage = field(default_factory=Usage)
    error: str | None = None  # set when no valid answer came: what was wrong with the last one
    prompt: str | None = None
    prompt_holder: str | None = None

    def __post_init__(self) -> None:
        valid_fields(self, "question", "error", "prompt", "prompt_holder")
        object.__setattr__(self, "answer", freeze(self.answer, "the answer"))


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalRecord:
    """A person's decision on a call that waited for one: who (`by`), why (`reason`).

    `approved` True lets the call run (once, at the next run); False gives it an error result
    the model reads. When: the entry's `at`.
    """

    call_id: str
    approved: bool
    by: str | None = None
    reason: str | None = None

    def __post_init__(self) -> None:
        valid_fields(self, "call_id", "by", "reason")


@dataclass(frozen=True, slots=True, kw_only=True)
class _Entry:
    seq: int
    turn: int
    at: datetime = field(compare=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextChangeEntry(_Entry):
    """The context was changed: `content.kind` says how."""

    content: ContextChange
    kind: Literal["context_change"] = field(default="context_change", init=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExtraDataEntry(_Entry):
    """`extra_data` changed: the keys set and the keys removed."""

    content: ExtraDataChange
    kind: Literal["extra_data"] = field(default="extra_data", init=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStartEntry(_Entry):
    """A run began. The first one links the State to the tool call that started it."""

    content: RunStart
    kind: Literal["run_start"] = field(default="run_start", init=False)

    @property
    def parent_id(self) -> str | None:
        """The id of the State whose tool call started this run, or None."""
        return self.content.parent_id

    @property
    def parent_call_id(self) -> str | None:
        """The id of the parent's tool call that started this run, or None."""
        return self.content.parent_call_id


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRequestEntry(_Entry):
    """A think sent a request; the model is being waited on until its reply or error."""

    content: ModelRequest
    kind: Literal["model_request"] = field(default="model_request", init=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptEntry(_Entry):
    """A prompt that the requests after it name by digest: recorded once per State."""

    content: Prompt
    kind: Literal["prompt"] = field(default="prompt", init=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelReplyEntry(_Entry):
    """The model replied; `content` is the `Reply`."""

    content: Reply
    kind: Literal["model_reply"] = field(default="model_reply", init=False)

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The tool calls the reply requested."""
        return self.content.message.tool_calls


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolResultEntry(_Entry):
    """A tool call got its result.

    `outcome` says how it ended, `child_ids` lists the subagent States it started, `usage` is what
    they spent, `state_update` is the tool's update to typed data, and `late` marks a result that
    came after the call had already been closed (it does not enter the messages).

    `merge_due` says the update waits for the turn to close: then the agent that ran the tool
    merges the turn's updates in request order, with the tools' own handlers, as one `extra_data`
    entry (`turn_merge`). A handler is code, which the history cannot hold: until that entry is
    recorded (a State loaded or forked mid-turn), the update is due, never merged another way.
    """

    content: ToolResultBlock
    call: ToolCall
    outcome: Outcome
    child_ids: tuple[str, ...] = ()
    late: bool = False
    usage: Usage = field(default_factory=Usage)
    state_update: Mapping[str, Any] | None = None
    merge_due: bool = False
    kind: Literal["tool_result"] = field(default="tool_result", init=False)

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(
                f"ToolResultEntry.outcome must be one of {sorted(OUTCOMES)}, got {self.outcome!r}."
            )
        if self.state_update is not None:
            object.__setattr__(
                self, "state_update", freeze_values(self.state_update, "state_update")
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class UserEntry(_Entry):
    """A user message was added."""

    content: Message
    kind: Literal["user"] = field(default="user", init=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class NoticeEntry(_Entry):
    """A notice was added (a user message starting with ``"[notice] "``)."""

    content: Message
    kind: Literal["notice"] = field(default="notice", init=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorEntry(_Entry):
    """A think or a run failed: ``"TypeName: message"``."""

    content: str
    kind: Literal["error"] = field(default="error", init=False)

    def __post_init__(self) -> None:
        valid_fields(self, "content")


@dataclass(frozen=True, slots=True, kw_only=True)
class StopEntry(_Entry):
    """Something decided that the run stops: the `Stopped` value."""

    content: AnyStopped
    kind: Literal["stop"] = field(default="stop", init=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class AskEntry(_Entry):
    """`agent.ask` was answered; the context did not change."""

    content: AskRecord
    kind: Literal["ask"] = field(default="ask", init=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalEntry(_Entry):
    """A person approved or denied a call that waited for a decision."""

    content: ApprovalRecord
    kind: Literal["approval"] = field(default="approval", init=False)


HistoryEntry: TypeAlias = (
    ContextChangeEntry
    | ExtraDataEntry
    | RunStartEntry
    | ModelRequestEntry
    | ModelReplyEntry
    | ToolResultEntry
    | UserEntry
    | NoticeEntry
    | ErrorEntry
    | StopEntry
    | AskEntry
    | ApprovalEntry
    | PromptEntry
)
ENTRY_TYPES: tuple[type[HistoryEntry], ...] = HistoryEntry.__args__  # type: ignore[attr-defined]
KIND_OF: dict[type[HistoryEntry], str] = {
    cls: cls.__dataclass_fields__["kind"].default for cls in ENTRY_TYPES
}
