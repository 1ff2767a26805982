"""`FakeModel`: a scripted model for offline examples and tests."""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Iterable
from typing import Any

import anyio.lowlevel

from .._base._messages import Block, Image, Message, RawBlock, ReasoningBlock, TextBlock, ToolCall
from .._base._reply import Reply, Usage
from ..models import Request, TextCallback

__all__ = ("FakeModel", "FakeModelExhausted", "tool_call")


# What every scripted reply spent; a Usage is immutable, so all of them share this one.
_ONE_REQUEST = Usage(requests=1)


class FakeModelExhausted(AssertionError):
    """The FakeModel was asked for more replies than it was given."""


# Its own generator: seeding `random` (hypothesis does) cannot make ids repeat; reseeded in a
# forked child, which would otherwise draw the parent's ids; and no uuid4, which makes a
# system call for each id.
_IDS = random.Random()
if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_IDS.seed)


def tool_call(name: str, /, **args: Any) -> ToolCall:
    """A `ToolCall` of the tool `name` with `args`, under a fresh id."""
    return ToolCall(f"call_{_IDS.getrandbits(64):016x}", name, args)


class FakeModel:
    """A model that answers from a script, in order, with no network.

    Items: a `str` (a text reply); a `ToolCall` (see `tool_call`); a list of calls, strings and
    blocks (one reply); a `Reply` (returned as is, usage included); an exception instance
    (raised); or a callable taking the `Request` and returning one of these.

    It is thread-safe and records every request in `requests`.

    Example:
        ```python
        model = FakeModel([tool_call("add", a=1, b=2), "The sum is 3."])
        ```
    """

    def __init__(
        self,
        replies: Iterable[Any] = (),
        *,
        name: str = "fake",
        context_window: int | None = 200_000,
    ) -> None:
        if isinstance(replies, str | bytes):
            raise TypeError("FakeModel takes a list of replies, e.g. FakeModel(['hello']).")
        self._replies: list[Any] = list(replies)
        self._next = 0
        self._lock = threading.Lock()
        self._name = name
        self._context_window = context_window
        self.requests: list[Request] = []

    @property
    def name(self) -> str:
        """The model's name."""
        return self._name

    @property
    def context_window(self) -> int | None:
        """The context window it claims."""
        return self._context_window

    @property
    def remaining(self) -> int:
        """How many scripted replies are left."""
        return len(self._replies) - self._next

    async def respond(self, request: Request, *, on_text: TextCallback | None = None) -> Reply:
        """The next scripted reply for `request`."""
        await anyio.lowlevel.checkpoint()
        with self._lock:
            self.requests.append(request)
            if self._next >= len(self._replies):
                raise FakeModelExhausted(
                    f"FakeModel ran out of replies: it was given {len(self._replies)} and this is"
                    f" request {len(self.requests)}. Add more replies to the FakeModel script."
                )
            item = self._replies[self._next]
            self._next += 1
        if callable(item) and not isinstance(item, ToolCall | BaseException | type):
            item = item(request)
        reply = self._reply(item)
        if on_text is not None and reply.message.text:
            on_text(reply.message.text)
        return reply

    def _reply(self, item: Any) -> Reply:
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, Reply):
            return item
        usage = _ONE_REQUEST
        if isinstance(item, str):
            return Reply(Message.assistant(item), usage, stop_reason="end_turn", model=self._name)
        if isinstance(item, ToolCall):
            message = Message("assistant", (item,))
            return Reply(message, usage, stop_reason="tool_use", model=self._name)
        if isinstance(item, list | tuple):
            blocks: list[Block] = []
            for part in item:  # pyright: ignore[reportUnknownVariableType]
                if isinstance(part, str):
                    blocks.append(TextBlock(part))
                elif isinstance(part, ToolCall | TextBlock | ReasoningBlock | RawBlock | Image):
                    blocks.append(part)
                else:
                    raise TypeError(
                        "A FakeModel reply list holds strs, ToolCalls and blocks (TextBlock,"
                        " ReasoningBlock, RawBlock, Image),"
                        f" got {type(part).__name__}."  # pyright: ignore[reportUnknownArgumentType]
                    )
            message = Message("assistant", tuple(blocks))
            stop = "tool_use" if message.tool_calls else "end_turn"
            return Reply(message, usage, stop_reason=stop, model=self._name)
        raise TypeError(
            f"FakeModel cannot reply with a {type(item).__name__}: give a str, a ToolCall, a list"
            " of them, a Reply, an exception, or a function of the request."
        )
