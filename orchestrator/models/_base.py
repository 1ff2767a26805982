"""The model protocol: what an Agent asks, and what it gets back."""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .._base._messages import Image, Message, ReasoningBlock, TextBlock, ToolCall, ToolResultBlock
from .._base._reply import Reply

if TYPE_CHECKING:
    from .._tooling._tools import ToolSpec

__all__ = (
    "Model",
    "ModelWithOptions",
    "Request",
    "TextCallback",
    "estimate_tokens",
    "message_tokens",
    "model_from_string",
    "ollama_base_url",
    "options_of",
    "resolve_model",
)

TextCallback = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Request:
    """One model request: the instructions, the messages the model sees, and the tool specs.

    `messages` is a read-only sequence (compare it with a tuple or list, index and iterate it).
    `estimate` is the input tokens the request is expected to hold, when its sender knows: an
    agent's run gives the tokens its model reported for the conversation so far plus the new
    messages' (`message_tokens`). None: a rate limit counts the request's characters instead.
    It is a hint, not what the model is told: two requests that differ only in it are equal.
    """

    system: str | None
    messages: Sequence[Message]
    tools: tuple[ToolSpec, ...] = ()
    estimate: int | None = field(default=None, compare=False)


_IMAGE_CHARS = 4_000  # an image counts as 1,000 tokens


def _chars(messages: Iterable[Message]) -> int:
    """The characters `messages` stand for: text, tool calls' arguments and results, images."""
    chars = 0
    for message in messages:
        chars += 16
        for block in message.content:
            if isinstance(block, TextBlock | ReasoningBlock):
                chars += len(block.text)
            elif isinstance(block, ToolCall):
                # Its arguments' keys and values as text: a frozen dict's own str() is slower.
                chars += len(block.name) + 2
                for key, value in block.args.items():
                    text = value if type(value) is str else str(value)
                    chars += len(key) + 4 + len(text)
            elif isinstance(block, ToolResultBlock):
                chars += 16
                for item in block.content:
                    chars += len(item.text) if isinstance(item, TextBlock) else _IMAGE_CHARS
            elif isinstance(block, Image):
                chars += _IMAGE_CHARS
    return chars


def message_tokens(messages: Iterable[Message]) -> int:
    """A rough count of the tokens `messages` hold: 4 characters a token, an image 1,000."""
    return _chars(messages) // 4


def estimate_tokens(request: Request) -> int:
    """The input tokens `request` is expected to hold, to pace it by: its `estimate` when given.

    Otherwise counted (4 characters a token): the instructions, text, tool calls' arguments,
    tool results and the tool specs; an image (in a message or a tool result) counts as 1,000.
    """
    if request.estimate is not None:
        return request.estimate
    chars = len(request.system or "") + _chars(request.messages)
    for spec in request.tools:
        chars += len(spec.name) + len(spec.description) + len(str(spec.input_schema))
    return chars // 4 + 1


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


@runtime_checkable
class ModelWithOptions(Protocol):
    """A model that tells its request options (temperature, max tokens...), recorded in history.

    The options are what a request sends besides the instructions, tools and messages: JSON.
    A model without them records none; replay compares them with the recorded ones.
    """

    @property
    def options(self) -> dict[str, Any]:
        """The request options, as JSON."""
        ...


def options_of(model: Model) -> dict[str, Any]:
    """The request options `model` tells (`ModelWithOptions`), or none: what a wrapper forwards."""
    return dict(model.options) if isinstance(model, ModelWithOptions) else {}


_MODEL_MEMBERS = ("name", "context_window", "respond")
_PROVIDERS = ("openai", "openai-responses", "anthropic", "ollama")
_OLLAMA_PORT = 11434


def ollama_base_url() -> str:
    """The local Ollama server's OpenAI-compatible root, from ``OLLAMA_HOST`` when it is set."""
    host = os.environ.get("OLLAMA_HOST", "").strip().rstrip("/")
    if not host:
        return f"http://localhost:{_OLLAMA_PORT}/v1"
    if "://" not in host:
        host = f"http://{host}"
    scheme, _, rest = host.partition("://")
    hostname, colon, port = rest.partition(":")
    if hostname in ("0.0.0.0", ""):
        hostname = "localhost"
    return f"{scheme}://{hostname}:{port if colon and port else _OLLAMA_PORT}/v1"


def _string_hint(text: str) -> str:
    """A 'did you mean' for a model string that is not 'provider:model'."""
    provider, colon, name = text.partition(":")
    if colon:
        close = difflib.get_close_matches(provider.lower(), _PROVIDERS, n=1, cutoff=0.6)
        return f" Did you mean {close[0] + ':' + name!r}?" if close and name else ""
    lowered = text.lower()
    if lowered.startswith(("gpt", "o1", "o3", "o4", "chatgpt")):
        return f" Did you mean {'openai:' + text!r}?"
    if lowered.startswith("claude"):
        return f" Did you mean {'anthropic:' + text!r}?"
    return ""


def model_from_string(text: str) -> Model:
    """The provider model a string like ``"openai:gpt-4o"`` names.

    ``"openai:<name>"`` is `OpenAIModel`, ``"openai-responses:<name>"`` is
    `OpenAIResponsesModel` (the Responses API), ``"anthropic:<name>"`` is `AnthropicModel`, and
    ``"ollama:<name>"`` is `OpenAIModel` at the local Ollama server (``OLLAMA_HOST``, else
    ``localhost:11434``). For any other server, build ``OpenAIModel(name, base_url=...)``.

    Raises:
        ValueError: The string names no known provider, or no model.
        ImportError: The provider's SDK is not installed; the message names the command.
    """
    provider, colon, name = text.partition(":")
    if not colon or provider not in _PROVIDERS or not name.strip():
        valid = ", ".join(f"'{known}:<model>'" for known in _PROVIDERS)
        raise ValueError(
            f"Model string {text!r} is not 'provider:model'. Use one of {valid}"
            " (e.g. 'openai:gpt-4o'), or pass a Model object such as"
            " OpenAIModel(name, base_url=...) or orchestrator.testing.FakeModel([...])."
            + _string_hint(text)
        )
    if provider == "anthropic":
        from ._anthropic import AnthropicModel

        return AnthropicModel(name)
    if provider == "openai-responses":
        from ._responses import OpenAIResponsesModel

        return OpenAIResponsesModel(name)
    from ._openai import OpenAIModel

    if provider == "ollama":
        return OpenAIModel(name, base_url=ollama_base_url(), api_key="ollama")
    return OpenAIModel(name)


def resolve_model(model: Model | str) -> Model:
    """`model` itself, or the provider model a string like ``"openai:gpt-4o"`` names.

    Raises:
        TypeError: `model` is neither a `Model` nor a string.
        ValueError: The string names no known provider (the message lists them).
        ImportError: The provider's SDK is not installed; the message names the command.
    """
    if isinstance(model, str):
        return model_from_string(model)
    # What isinstance(model, Model) checks, without its cost (a runtime protocol check is
    # slow, paid by every Agent, and a subagent makes one per call).
    if not all(hasattr(model, member) for member in _MODEL_MEMBERS):
        raise TypeError(
            f"Agent(model=...) takes a Model (with name, context_window and async respond) or a"
            f" 'provider:model' string, got {type(model).__name__}."
        )
    return model
