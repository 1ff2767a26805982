"""Messages and their content blocks: what the model reads and writes.

A `Message` is frozen: a role (``"user"`` or ``"assistant"``) and a tuple of blocks. Tool results
reach the model as one user message holding the turn's `ToolResultBlock`s in request order.
"""

from __future__ import annotations

import base64
import binascii
import mimetypes
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, TypeAlias, cast

from pydantic import Field

from ._json import freeze, freeze_values, valid_fields, valid_text

__all__ = (
    "Block",
    "Image",
    "Message",
    "RawBlock",
    "ReasoningBlock",
    "TextBlock",
    "ToolCall",
    "ToolResultBlock",
)

NOTICE_PREFIX = "[notice] "

# The key of `ToolCall.args` under which a provider keeps argument text that was not a JSON
# object (cut off, or malformed): the tool's argument check reports it back to the model.
INVALID_ARGUMENTS = "__invalid_arguments__"

_IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")


def _require_str(owner: str, name: str, value: object) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{owner}.{name} must be a str, got {type(value).__name__}.")


@dataclass(frozen=True, slots=True)
class TextBlock:
    """Plain text. A lone surrogate in it (half a character: UTF-8 has none) becomes U+FFFD."""

    text: str
    kind: Literal["text"] = field(default="text", init=False, repr=False)

    def __post_init__(self) -> None:
        text = self.text
        if type(text) is not str or not text.isascii():  # ASCII text: O(1), nothing to do
            _require_str("TextBlock", "text", text)
            object.__setattr__(self, "text", valid_text(text))


@dataclass(frozen=True, slots=True)
class Image:
    """An image given as bytes with its media type, e.g. ``Image(data, "image/png")``."""

    data: bytes
    media_type: str
    kind: Literal["image"] = field(default="image", init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.data, bytes):
            raise TypeError(
                f"Image.data must be bytes, got {type(self.data).__name__}:"
                " use Image.from_path(path) or Image.from_base64(text, media_type)."
            )
        if self.media_type not in _IMAGE_TYPES:
            raise ValueError(
                f"Image.media_type {self.media_type!r} is not supported: use one of {_IMAGE_TYPES}."
            )

    def __repr__(self) -> str:
        return f"Image(<{len(self.data)} bytes>, {self.media_type!r})"

    @classmethod
    def from_path(cls, path: str | Path, media_type: str | None = None) -> Image:
        """Read an image file; the media type is guessed from the file name unless given."""
        path = Path(path)
        guessed = media_type or mimetypes.guess_type(path.name)[0]
        if guessed is None:
            raise ValueError(
                f"Cannot tell the media type of {path.name!r}: pass media_type='image/png'"
                f" (or another of {_IMAGE_TYPES})."
            )
        return cls(path.read_bytes(), guessed)

    @classmethod
    def from_base64(cls, data: str, media_type: str) -> Image:
        """Decode base64 text (as providers send it) into an image."""
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as error:
            raise ValueError(f"Image.from_base64 got text that is not base64: {error}.") from None
        return cls(raw, media_type)

    def to_base64(self) -> str:
        """The image bytes as base64 text."""
        return base64.b64encode(self.data).decode("ascii")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """The model's request to run the tool `name` with `args` (a frozen dict).

    `id` links the call to its result.
    """

    id: str
    name: str
    args: Mapping[str, Any] = field(default_factory=dict[str, Any])
    kind: Literal["tool_call"] = field(default="tool_call", init=False, repr=False)

    def __post_init__(self) -> None:
        _require_str("ToolCall", "id", self.id)
        _require_str("ToolCall", "name", self.name)
        valid_fields(self, "id", "name")
        if not isinstance(self.args, Mapping):
            raise TypeError(
                f"ToolCall.args must be a dict of arguments, got {type(self.args).__name__}."
            )
        args = freeze_values(self.args, f"ToolCall({self.name!r}).args")
        object.__setattr__(self, "args", args)


# Discriminated by `kind`, so a stored block always decodes to its own class.
ResultContent: TypeAlias = Annotated["TextBlock | Image", Field(discriminator="kind")]


@dataclass(frozen=True, slots=True)
class ToolResultBlock:
    """The result of the tool call `call_id`: text and images, flagged when it is an error."""

    call_id: str
    content: tuple[ResultContent, ...]
    is_error: bool = False
    kind: Literal["tool_result"] = field(default="tool_result", init=False, repr=False)

    def __post_init__(self) -> None:
        _require_str("ToolResultBlock", "call_id", self.call_id)
        valid_fields(self, "call_id")
        content: object = self.content
        if type(content) is not tuple:  # the common case, a tuple, is kept as it is
            if isinstance(content, str):
                content = (TextBlock(content),)
            if not isinstance(content, Iterable):
                raise TypeError("ToolResultBlock.content must be a str or a sequence of blocks.")
            content = tuple(content)  # pyright: ignore[reportUnknownArgumentType]
            object.__setattr__(self, "content", content)
        for block in cast("tuple[object, ...]", content):
            if not isinstance(block, TextBlock | Image):
                raise TypeError(
                    "ToolResultBlock.content holds TextBlock and Image items only,"
                    f" got {type(block).__name__}."
                )
        if type(self.is_error) is not bool:
            object.__setattr__(self, "is_error", bool(self.is_error))

    @property
    def text(self) -> str:
        """The text of the result, its text blocks joined."""
        return "".join(block.text for block in self.content if isinstance(block, TextBlock))


@dataclass(frozen=True, slots=True)
class ReasoningBlock:
    """The model's reasoning, when the provider returns it."""

    text: str
    kind: Literal["reasoning"] = field(default="reasoning", init=False, repr=False)

    def __post_init__(self) -> None:
        _require_str("ReasoningBlock", "text", self.text)
        valid_fields(self, "text")


@dataclass(frozen=True, slots=True)
class RawBlock:
    """Provider-specific content, kept as JSON and sent back only to the same provider."""

    provider: str
    data: Any
    kind: Literal["raw"] = field(default="raw", init=False, repr=False)

    def __post_init__(self) -> None:
        _require_str("RawBlock", "provider", self.provider)
        valid_fields(self, "provider")
        object.__setattr__(self, "data", freeze(self.data, "RawBlock.data"))


Block: TypeAlias = TextBlock | Image | ToolCall | ToolResultBlock | ReasoningBlock | RawBlock
_BLOCK_TYPES = (TextBlock, Image, ToolCall, ToolResultBlock, ReasoningBlock, RawBlock)
AnyBlock: TypeAlias = Annotated[Block, Field(discriminator="kind")]


@dataclass(frozen=True, slots=True)
class Message:
    """One message of the conversation: a role and a tuple of content blocks.

    Build them with `Message.user`, `Message.notice` and `Message.assistant`.
    """

    role: Literal["user", "assistant"]
    content: tuple[AnyBlock, ...] = ()

    def __post_init__(self) -> None:
        if self.role not in ("user", "assistant"):
            raise ValueError(f"Message.role must be 'user' or 'assistant', got {self.role!r}.")
        content: object = self.content
        if type(content) is not tuple:  # the common case, a tuple, is kept as it is
            if isinstance(content, str):
                raise TypeError(
                    "Message.content is a tuple of blocks, not a str: use Message.user(text)"
                    " or Message.assistant(text)."
                )
            if not isinstance(content, Iterable):
                raise TypeError("Message.content must be a sequence of blocks.")
            content = tuple(content)  # pyright: ignore[reportUnknownArgumentType]
            object.__setattr__(self, "content", content)
        for block in cast("tuple[object, ...]", content):
            if not isinstance(block, _BLOCK_TYPES):
                raise TypeError(
                    f"Message.content holds blocks (TextBlock, Image, ToolCall, ...),"
                    f" got {type(block).__name__}."
                )

    @classmethod
    def user(cls, text: str, *images: Image) -> Message:
        """A user message with text and optional images."""
        _require_str("Message.user", "text", text)
        for image in images:
            if not isinstance(image, Image):
                raise TypeError(
                    f"Message.user takes Image objects after the text, got {type(image).__name__}."
                )
        blocks: tuple[Block, ...] = (TextBlock(text),) if text else ()
        return cls("user", blocks + images)

    @classmethod
    def notice(cls, text: str) -> Message:
        """A user message telling the model something from your loop or a tool.

        Its text starts with ``"[notice] "``; the prefix is added when missing.
        """
        _require_str("Message.notice", "text", text)
        if not text.startswith(NOTICE_PREFIX):
            text = NOTICE_PREFIX + text
        return cls("user", (TextBlock(text),))

    @classmethod
    def assistant(cls, text: str = "", tool_calls: Iterable[ToolCall] = ()) -> Message:
        """An assistant message: text and the tool calls it requests."""
        _require_str("Message.assistant", "text", text)
        calls = tuple(tool_calls)
        for call in calls:
            if not isinstance(call, ToolCall):
                raise TypeError(
                    f"Message.assistant takes ToolCall objects, got {type(call).__name__}."
                )
        blocks: tuple[Block, ...] = (TextBlock(text),) if text else ()
        return cls("assistant", blocks + calls)

    @property
    def text(self) -> str:
        """The text blocks joined (tool results, images and reasoning are left out)."""
        return "".join(block.text for block in self.content if isinstance(block, TextBlock))

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The tool calls this message requests, in order."""
        return tuple(block for block in self.content if isinstance(block, ToolCall))

    @property
    def tool_results(self) -> tuple[ToolResultBlock, ...]:
        """The tool results this message carries, in order."""
        return tuple(block for block in self.content if isinstance(block, ToolResultBlock))

    @property
    def images(self) -> tuple[Image, ...]:
        """The images of this message, in order."""
        return tuple(block for block in self.content if isinstance(block, Image))

    @property
    def is_notice(self) -> bool:
        """Whether this is a notice: a user message whose text starts with ``"[notice] "``."""
        return self.role == "user" and self.text.startswith(NOTICE_PREFIX)
