"""What a model returns: a `Reply` with its `Usage`."""

from __future__ import annotations

from dataclasses import dataclass, field

from ._json import valid_fields
from ._messages import Message

__all__ = ("NO_USAGE", "Reply", "Usage")

_COUNTS = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "requests",
    "reasoning_tokens",
)


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens, requests and cost. Add two with ``+``.

    `cost` is None when unknown. A sum's cost is unknown when either side's is, except that an
    empty `Usage()` (nothing spent) adds nothing, so ``Usage() + u == u``.
    `reasoning_tokens` (keyword only) are the part of `output_tokens` the model spent
    reasoning, when the provider tells it; they are in `output_tokens` and the cost already.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    requests: int = 0
    cost: float | None = None
    reasoning_tokens: int = field(default=0, kw_only=True)

    def __post_init__(self) -> None:
        # The fields read directly, not by name: every reply and every sum builds a Usage.
        for value in (
            self.input_tokens,
            self.output_tokens,
            self.cache_read_tokens,
            self.cache_write_tokens,
            self.requests,
            self.reasoning_tokens,
        ):
            if type(value) is not int or value < 0:
                self._check_counts()
                break
        cost = self.cost
        if cost is not None and (isinstance(cost, bool) or not isinstance(cost, int | float)):
            raise TypeError(f"Usage.cost must be a number or None, got {cost!r}.")

    def _check_counts(self) -> None:
        """Turn int subclasses (not bool) into ints; raise for any other count or one < 0."""
        for name in _COUNTS:
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                    object.__setattr__(self, name, int(value))
                    continue
                raise ValueError(f"Usage.{name} must be an int >= 0, got {value!r}.")

    def is_empty(self) -> bool:
        """Whether nothing was spent: every count 0 and no cost."""
        return self is NO_USAGE or (
            self.cost is None
            and not self.requests
            and not self.input_tokens
            and not self.output_tokens
            and not self.cache_read_tokens
            and not self.cache_write_tokens
            and not self.reasoning_tokens
        )

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        if other.is_empty():
            return self
        if self.is_empty():
            return other
        cost = None if self.cost is None or other.cost is None else self.cost + other.cost
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            requests=self.requests + other.requests,
            cost=cost,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
        )


NO_USAGE = Usage()
"""Nothing spent: shared, so code that often has nothing to add does not build one."""


@dataclass(frozen=True, slots=True)
class Reply:
    """One model reply: the assistant `message`, its `usage`, why it stopped and which model."""

    message: Message
    usage: Usage = field(default_factory=Usage)
    stop_reason: str | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.message, Message):
            raise TypeError(f"Reply.message must be a Message, got {type(self.message).__name__}.")
        if self.message.role != "assistant":
            raise ValueError("Reply.message must be an assistant message (Message.assistant(...)).")
        if not isinstance(self.usage, Usage):
            raise TypeError(f"Reply.usage must be a Usage, got {type(self.usage).__name__}.")
        valid_fields(self, "stop_reason", "model")
