"""The model protocol: what an Agent asks, and what it gets back."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .._messages import Message
from .._reply import Reply

if TYPE_CHECKING:
    from .._tools import ToolSpec

__all__ = ("Model", "Request", "TextCallback", "resolve_model")

TextCallback = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Request:
    """One model request: the instructions, the messages the model sees, and the tool specs.

    `messages` is a read-only sequence (compare it with a tuple or list, index and iterate it).
    """

    system: str | None
    messages: Sequence[Message]
    tools: tuple[ToolSpec, ...] = ()


@runtime_checkable
class Model(Protocol):
    """A language model: `respond` turns a `Request` into a `Reply`.

    `on_text`, when given, receives the reply's text as it streams in.
    """

    @property
    def name(self) -> str:
        """The model's name, recorded in history."""
        ...

    @property
    def context_window(self) -> int | None:
        """How many tokens fit in one request, or None when unknown."""
        ...

    async def respond(self, request: Request, *, on_text: TextCallback | None = None) -> Reply:
        """Ask the model once."""
        ...


_PROVIDERS = {"openai": "openai", "anthropic": "anthropic", "ollama": "openai"}


def resolve_model(model: Model | str) -> Model:
    """`model` itself, or the provider model a string like ``"openai:gpt-4o"`` names.

    Raises:
        TypeError: `model` is neither a `Model` nor a string.
        ValueError: The string names no known provider, or providers are not available yet.
    """
    if isinstance(model, str):
        provider, _, name = model.partition(":")
        if provider not in _PROVIDERS or not name:
            raise ValueError(
                f"Model string {model!r} is not 'provider:model'. Use one of"
                f" {', '.join(p + ':<name>' for p in _PROVIDERS)}, or pass a Model object"
                " such as orchestrator.testing.FakeModel([...])."
            )
        raise ValueError(
            f"The {provider!r} provider is not available in this version of orchestrator:"
            " pass a Model object (orchestrator.testing.FakeModel for offline runs)."
        )
    if not isinstance(model, Model):
        raise TypeError(
            f"Agent(model=...) takes a Model (with name, context_window and async respond) or a"
            f" 'provider:model' string, got {type(model).__name__}."
        )
    return model
