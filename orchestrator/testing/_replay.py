"""`ReplayModel`: a saved run answers its own requests again, offline.

A State's history keeps each model request (how many messages it carried) and the reply or
error it got. Replaying the history up to a request gives the messages the model saw, so a
recorded run can be run again with the same agents and checked request by request: the first
request that differs (a tool that now returns something else, a changed prompt, a tool added)
is reported with what was expected and what came.

The model is shared by the whole tree: the lead and every subagent ask it. Each request is
matched by its content against the next recorded request of every State of the tree, so
subagents running in parallel, in any order, each get their own recorded replies.

It uses only the public names of `orchestrator` (this module is imported by
`orchestrator.testing`, after the package is whole).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio.lowlevel

from orchestrator import (
    AuthError,
    Block,
    ContextTooLongError,
    ErrorEntry,
    Image,
    Message,
    ModelReplyEntry,
    ModelRequestEntry,
    OrchestratorError,
    Prompt,
    ProviderError,
    RateLimitError,
    ReasoningBlock,
    Reply,
    RunStartEntry,
    State,
    Store,
    TextBlock,
    ToolCall,
    ToolResultBlock,
    ToolResultEntry,
    prompt_difference,
)
from orchestrator.models import Request, TextCallback

from .._record._sent import request_messages
from .._record._store_client import AnyStore, client_of

__all__ = (
    "ReplayMismatch",
    "ReplayModel",
    "agent_name",
    "child_ids",
    "describe_block",
    "describe_message",
    "message_difference",
    "messages_difference",
)

_SHOWN = 160  # characters of a text shown in a difference
_ERRORS: dict[str, type[OrchestratorError]] = {
    cls.__name__: cls for cls in (ProviderError, RateLimitError, AuthError, ContextTooLongError)
}


class ReplayMismatch(AssertionError):
    """A request differs from the recorded one, or the replay asked fewer requests.

    The message names the State and the request, and shows the first difference: what the
    recording has and what came.
    """


@dataclass(frozen=True, slots=True)
class _Expected:
    """One recorded request: the messages, tool names and prompt it carried, and its answer."""

    number: int  # 1-based, among its State's requests
    messages: tuple[Message, ...]
    tools: tuple[str, ...]
    reply: Reply | None
    error: str | None
    prompt: Prompt | None  # None: not recorded (a history from before prompts were)


class _Script:
    """The recorded requests of one State, and how many of them were asked."""

    __slots__ = ("agent", "expected", "next", "state_id")

    def __init__(self, state: State, tree: Mapping[str, State]) -> None:
        self.state_id = state.id
        self.agent = agent_name(state)
        self.expected = _requests(state, tree)
        self.next = 0

    def peek(self) -> _Expected | None:
        return self.expected[self.next] if self.next < len(self.expected) else None

    def where(self, expected: _Expected) -> str:
        agent = f"agent {self.agent!r}" if self.agent else "an unnamed agent"
        return (
            f"request {expected.number} of {len(self.expected)} of State {self.state_id} ({agent})"
        )


def agent_name(state: State) -> str | None:
    """The name of the agent that ran `state` first (its first `run_start`), or None."""
    for entry in state.history:
        if isinstance(entry, RunStartEntry):
            return entry.content.agent
    return None


def child_ids(state: State) -> list[str]:
    """The ids of the subagent States that `state`'s tool calls started, in order, once each."""
    ids: dict[str, None] = {}
    for entry in state.history:
        if isinstance(entry, ToolResultEntry):
            ids.update(dict.fromkeys(entry.child_ids))
    return list(ids)


def _requests(state: State, tree: Mapping[str, State]) -> list[_Expected]:
    """The requests `state` recorded, each with the reply or the error that answered it.

    A request's prompt is in `state`'s history, or in that of the State of `tree` it names (a
    child names the prompt its ancestor or an earlier sibling stored); a holder outside `tree`
    leaves it unknown, so it is not compared. Its messages are `request_messages`. A request
    that got neither a reply nor an error (a run still waiting) is left out.
    """
    sent = request_messages(state)
    found: list[_Expected] = []
    tools: tuple[str, ...] = ()
    waiting: ModelRequestEntry | None = None
    for entry in state.history:
        if isinstance(entry, RunStartEntry):
            tools = entry.content.tools
        elif isinstance(entry, ModelRequestEntry):
            waiting = entry
        elif waiting is not None and isinstance(entry, ModelReplyEntry | ErrorEntry):
            messages = sent[waiting.seq]
            reply = entry.content if isinstance(entry, ModelReplyEntry) else None
            error = entry.content if isinstance(entry, ErrorEntry) else None
            prompt = state.prompt_of(waiting)
            holder = tree.get(waiting.content.prompt_holder or "")
            if prompt is None and holder is not None:
                prompt = holder.prompt_of(waiting)
            found.append(_Expected(len(found) + 1, messages, tools, reply, error, prompt))
            waiting = None
    return found


def _tree(root: State) -> list[State]:
    """`root` and every State under it, parents first; children opened with `state.child`."""
    states = [root]
    for state in states:  # grows while it is walked: breadth first
        states.extend(state.child(child_id) for child_id in child_ids(state))
    return states


async def _atree(root: State) -> list[State]:
    """`_tree` with `state.achild`: a store is read without blocking the event loop."""
    states = [root]
    for state in states:
        for child_id in child_ids(state):
            states.append(await state.achild(child_id))
    return states


class ReplayModel:
    """A model that answers each request with the reply a saved run recorded for it.

    Build it from a saved State (its subagents are opened with `state.child`, from memory or
    its store), or with `ReplayModel.load(store, state_id)`, and give it to the same agents:
    their requests must be the recorded ones, in any order across the tree. A request that
    differs raises `ReplayMismatch` showing the first difference; so does every request after
    it, with the same message, so the run stops with it. `check()` says afterwards whether
    every recorded request was asked.

    A recorded model error is raised again (a `ProviderError`, or its subclass the recording
    names), so the run fails, or retries, as it did. The instructions and tool specs of each
    request are compared with the recorded prompt (a short diff shows the first difference);
    the options too when `options` is given (those of the model the run would use: the replay
    model stands in for it). A history from before prompts were recorded compares the tool
    names only. Only the model turns
    of a run (`think`) are replayed: `ask` and `compact` keep their answer in the history, not
    the model's reply, and a request from them is a mismatch.

    Example:
        ```python
        model = ReplayModel(saved_state)
        agent = Agent(model, tools=[search])
        agent.run(State(messages=[Message.user("Find the bug")]))
        model.check()
        ```
    """

    def __init__(
        self,
        state: State,
        *,
        name: str = "replay",
        context_window: int | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        """Replay `state` and every subagent State under it.

        Raises:
            TypeError: `state` is not a State, or its store works only asynchronously (use
                `ReplayModel.aload`).
            LookupError: A child is not in its store any more.
            ValueError: A child is not in memory and `state` has no store.
        """
        if not isinstance(state, State):
            raise TypeError(
                f"ReplayModel takes a saved State (or use ReplayModel.load(store, id)),"
                f" got {type(state).__name__}."
            )
        self._setup(_tree(state), name, context_window, options)

    def _setup(
        self,
        states: Sequence[State],
        name: str,
        context_window: int | None,
        options: Mapping[str, Any] | None,
    ) -> None:
        self._options = None if options is None else dict(options)
        self._name = name
        self._context_window = context_window
        tree = {state.id: state for state in states}
        self._scripts = [_Script(state, tree) for state in states]
        self._lock = threading.Lock()
        self._mismatch: ReplayMismatch | None = None
        self.requests: list[Request] = []

    @classmethod
    def load(cls, store: Store, state_id: str, **options: Any) -> ReplayModel:
        """Replay the State `state_id` of a sync `store`, with its subagents.

        Raises:
            LookupError: No State `state_id` (or one of its children) in the store.
            orchestrator.StoreDamagedError: The store is damaged.
        """
        return cls(store.load(state_id), **options)

    @classmethod
    async def aload(
        cls,
        store: AnyStore,
        state_id: str,
        *,
        name: str = "replay",
        context_window: int | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> ReplayModel:
        """`load` for async code: an `AsyncStore` is awaited, a sync one runs in a worker thread.

        Raises what `load` raises.
        """
        root = await client_of(store).load(state_id)
        model = cls.__new__(cls)
        model._setup(await _atree(root), name, context_window, options)
        return model

    @property
    def name(self) -> str:
        """The model's name, recorded in the replayed history."""
        return self._name

    @property
    def context_window(self) -> int | None:
        """The context window it claims (None unless given)."""
        return self._context_window

    @property
    def options(self) -> dict[str, Any]:
        """The options given (compared with the recorded ones), else none: what runs record."""
        return dict(self._options or {})

    @property
    def mismatch(self) -> ReplayMismatch | None:
        """The first difference seen, or None while every request matched."""
        return self._mismatch

    @property
    def state_ids(self) -> tuple[str, ...]:
        """The ids of the recorded States it replays: the root first, then its subagents."""
        return tuple(script.state_id for script in self._scripts)

    @property
    def remaining(self) -> int:
        """How many recorded requests were not asked yet."""
        return sum(len(script.expected) - script.next for script in self._scripts)

    @property
    def answered(self) -> int:
        """How many recorded requests were asked and answered."""
        return sum(script.next for script in self._scripts)

    def check(self) -> None:
        """Raise `ReplayMismatch` unless every recorded request was asked, and none differed.

        Raises:
            ReplayMismatch: The first difference, or the first State that asked fewer requests
                than it recorded.
        """
        if self._mismatch is not None:
            raise ReplayMismatch(str(self._mismatch))
        for script in self._scripts:
            expected = script.peek()
            if expected is not None:
                raise ReplayMismatch(
                    f"The replay asked fewer requests than the recording: State"
                    f" {script.state_id} asked {script.next} of its {len(script.expected)};"
                    f" {script.where(expected)} was never asked. It would have carried"
                    f" {len(expected.messages)} messages, the last:"
                    f" {describe_message(expected.messages[-1]) if expected.messages else '-'}."
                )

    async def respond(self, request: Request, *, on_text: TextCallback | None = None) -> Reply:
        """The recorded reply to `request`.

        Raises:
            ReplayMismatch: No recorded request is this one (or an earlier one differed).
            ProviderError: The recorded request got this error.
        """
        await anyio.lowlevel.checkpoint()
        with self._lock:
            self.requests.append(request)
            if self._mismatch is not None:
                raise ReplayMismatch(str(self._mismatch))
            expected = self._match(request)
        if expected.reply is None:
            raise _recorded_error(str(expected.error))
        if on_text is not None and expected.reply.message.text:
            on_text(expected.reply.message.text)
        return expected.reply

    def _match(self, request: Request) -> _Expected:
        messages = tuple(request.messages)
        tools = tuple(spec.name for spec in request.tools)
        told: list[tuple[_Script, _Expected, str]] = []  # same messages, another prompt
        for script in self._scripts:
            expected = script.peek()
            if expected is not None and expected.tools == tools and expected.messages == messages:
                difference = self._prompt_difference(expected, request)
                if difference is None:
                    script.next += 1
                    return expected
                told.append((script, expected, difference))
        if told:
            script, expected, difference = told[0]
            self._mismatch = ReplayMismatch(
                f"The request differs from the recording at {script.where(expected)}: {difference}"
            )
        else:
            self._mismatch = ReplayMismatch(self._difference(request, messages, tools))
        raise self._mismatch

    def _prompt_difference(self, expected: _Expected, request: Request) -> str | None:
        """How the request's prompt differs from the recorded one (None: same, or not recorded).

        The options are compared only when the replay was given them.
        """
        recorded = expected.prompt
        if recorded is None:
            return None
        options = recorded.options if self._options is None else self._options
        return prompt_difference(recorded, Prompt.of(request.system, request.tools, options))

    def _difference(
        self, request: Request, messages: tuple[Message, ...], tools: tuple[str, ...]
    ) -> str:
        """Where the request differs from the recorded request closest to it."""
        waiting = [(script, script.peek()) for script in self._scripts if script.peek()]
        if not waiting:
            last = describe_message(messages[-1]) if messages else "-"
            return (
                f"The model was asked more often than in the recording: every recorded request"
                f" was answered, and then came one with {len(messages)} messages, the last:"
                f" {last}."
            )
        # The recorded request that shares the longest start with this one is the one it
        # stands for; the first State of the tree when none shares anything.
        script, expected = max(
            waiting, key=lambda pair: _common(pair[1].messages, messages) if pair[1] else 0
        )
        assert expected is not None
        head = f"The request differs from the recording at {script.where(expected)}"
        difference = messages_difference(expected.messages, messages)
        if difference is not None:
            return f"{head}: {difference}"
        if expected.tools != tools:
            return (
                f"{head}: the tools differ. Expected: {', '.join(expected.tools) or '(none)'}."
                f" Got: {', '.join(tools) or '(none)'}."
            )
        return f"{head}: {self._prompt_difference(expected, request) or 'the prompts differ'}"


def messages_difference(want: Sequence[Message], got: Sequence[Message]) -> str | None:
    """Where the messages `got` first differ from the recorded `want`, or None if they do not."""
    same = _common(want, got)
    if same < len(want) and same < len(got):
        return f"message {same} differs. " + message_difference(want[same], got[same])
    if same < len(want):
        return (
            f"it has {len(got)} messages, the recording {len(want)}; message {same} is missing."
            f" Expected: {describe_message(want[same])}"
        )
    if same < len(got):
        return (
            f"it has {len(got)} messages, the recording {len(want)}; message {same} is extra."
            f" Got: {describe_message(got[same])}"
        )
    return None


def _common(left: Sequence[Message], right: Sequence[Message]) -> int:
    """How many messages the two lists share from the start."""
    count = 0
    for a, b in zip(left, right, strict=False):
        if a != b:
            break
        count += 1
    return count


def message_difference(want: Message, got: Message) -> str:
    """Where two messages first differ: role, a block, or the number of blocks."""
    if want.role != got.role:
        return f"Expected: {describe_message(want)} Got: {describe_message(got)}"
    for index, (a, b) in enumerate(zip(want.content, got.content, strict=False)):
        if a != b:
            if isinstance(a, TextBlock) and isinstance(b, TextBlock):
                left, right = _text_windows(a.text, b.text)
                return f"Its block {index} (text) differs. Expected: {left} Got: {right}"
            if (
                isinstance(a, ToolResultBlock)
                and isinstance(b, ToolResultBlock)
                and (a.call_id, a.is_error) == (b.call_id, b.is_error)
            ):
                left, right = _text_windows(a.text, b.text)
                return (
                    f"Its block {index}, the result of {a.call_id}, differs."
                    f" Expected: {left} Got: {right}"
                )
            return (
                f"Its block {index} differs. Expected: {describe_block(a)} Got: {describe_block(b)}"
            )
    if len(want.content) > len(got.content):
        missing = describe_block(want.content[len(got.content)])
        return f"It lacks block {len(got.content)}. Expected: {missing}"
    extra = describe_block(got.content[len(want.content)])
    return f"It has an extra block {len(want.content)}. Got: {extra}"


def _text_windows(left: str, right: str) -> tuple[str, str]:
    """Both texts as reprs, cut around where they first differ."""
    start = 0
    for index, (a, b) in enumerate(zip(left, right, strict=False)):
        if a != b:
            start = index
            break
    else:
        start = min(len(left), len(right))
    begin = max(0, start - _SHOWN // 2)
    return _window(left, begin), _window(right, begin)


def _window(text: str, begin: int) -> str:
    part = text[begin : begin + _SHOWN]
    return ("..." if begin else "") + repr(part) + ("..." if begin + _SHOWN < len(text) else "")


def _short(text: str) -> str:
    return repr(text) if len(text) <= _SHOWN else repr(text[:_SHOWN]) + "..."


def describe_block(block: Block) -> str:
    """One content block in a line: text, a tool call, a result, an image."""
    if isinstance(block, TextBlock):
        return _short(block.text)
    if isinstance(block, ToolCall):
        args = json.dumps(block.args, ensure_ascii=False, sort_keys=True)
        return f"call {block.name}({_short(args)[1:-1]}) [{block.id}]"
    if isinstance(block, ToolResultBlock):
        error = " (error)" if block.is_error else ""
        return f"result of {block.call_id}{error}: {_short(block.text)}"
    if isinstance(block, Image):
        return f"image ({block.media_type}, {len(block.data)} bytes)"
    if isinstance(block, ReasoningBlock):
        return f"reasoning {_short(block.text)}"
    return f"raw block of {block.provider}"


def describe_message(message: Message) -> str:
    """A message in a line: its role and blocks."""
    blocks = "; ".join(describe_block(block) for block in message.content) or "(empty)"
    return f"{message.role}: {blocks}"


def _recorded_error(text: str) -> OrchestratorError:
    """The error a recorded request got, raised again: its class when it is a provider's."""
    name, colon, message = text.partition(": ")
    cls = _ERRORS.get(name) if colon else None
    return cls(message) if cls is not None else ProviderError(text)
