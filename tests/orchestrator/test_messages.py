"""Messages and content blocks: construction, checks, derived properties and immutability."""

from __future__ import annotations

import base64
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from orchestrator import (
    FrozenDict,
    FrozenList,
    Image,
    Message,
    RawBlock,
    ReasoningBlock,
    TextBlock,
    ToolCall,
    ToolResultBlock,
)
from tests.doubles import as_any, is_a

PNG_BYTES = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


def _png() -> Image:
    return Image(PNG_BYTES, "image/png")


# -- Message -----------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["user", "assistant"])
def test_message_accepts_user_and_assistant_roles(role: Any) -> None:
    message = Message(role, (TextBlock("hi"),))
    assert message.role == role
    assert message.content == (TextBlock("hi"),)


@pytest.mark.parametrize("role", ["system", "tool", "User", "", None])
def test_message_rejects_other_roles(role: object) -> None:
    with pytest.raises(ValueError, match="role"):
        Message(as_any(role), ())


def test_message_content_becomes_a_tuple() -> None:
    blocks = [TextBlock("a"), TextBlock("b")]
    message = Message("user", as_any(blocks))
    assert isinstance(message.content, tuple)
    assert message.content == (TextBlock("a"), TextBlock("b"))
    blocks.append(TextBlock("c"))
    assert len(message.content) == 2


def test_message_content_defaults_to_empty_tuple() -> None:
    assert Message("assistant").content == ()


def test_message_content_str_is_refused_with_a_hint() -> None:
    with pytest.raises(TypeError, match=r"Message\.user"):
        Message("user", as_any("hello"))


@pytest.mark.parametrize("item", ["text", {"type": "text"}, 3, None])
def test_message_content_with_a_non_block_is_refused(item: object) -> None:
    with pytest.raises(TypeError):
        Message("user", as_any([TextBlock("ok"), item]))


def test_message_content_that_is_not_iterable_is_refused() -> None:
    with pytest.raises(TypeError):
        Message("user", as_any(42))


def test_message_text_joins_text_blocks_only() -> None:
    call = ToolCall("c1", "search", {"q": "x"})
    message = Message(
        "assistant",
        (TextBlock("Hello, "), ReasoningBlock("thinking"), call, TextBlock("world")),
    )
    assert message.text == "Hello, world"


def test_message_text_is_empty_without_text_blocks() -> None:
    assert Message("user", (_png(),)).text == ""


def test_message_tool_calls_in_order() -> None:
    first = ToolCall("c1", "a", {})
    second = ToolCall("c2", "b", {"x": 1})
    message = Message("assistant", (TextBlock("t"), first, TextBlock("u"), second))
    assert message.tool_calls == (first, second)
    assert Message.user("no calls").tool_calls == ()


def test_message_user_with_text() -> None:
    message = Message.user("Find the bug")
    assert message.role == "user"
    assert message.content == (TextBlock("Find the bug"),)
    assert message.text == "Find the bug"
    assert not message.is_notice


def test_message_user_with_images_keeps_their_order() -> None:
    first = _png()
    second = Image(b"\xff\xd8\xff", "image/jpeg")
    message = Message.user("look", first, second)
    assert message.content == (TextBlock("look"), first, second)


def test_message_user_with_only_images() -> None:
    image = _png()
    message = Message.user("", image)
    assert message.content == (image,)
    assert message.text == ""


def test_message_user_rejects_non_image_extras() -> None:
    with pytest.raises(TypeError, match="Image"):
        Message.user("hi", as_any("not an image"))


def test_message_user_rejects_non_str_text() -> None:
    with pytest.raises(TypeError):
        Message.user(as_any(123))


def test_message_notice_adds_the_prefix() -> None:
    message = Message.notice("budget is low")
    assert message.role == "user"
    assert message.text == "[notice] budget is low"
    assert message.is_notice


def test_message_notice_does_not_double_the_prefix() -> None:
    message = Message.notice("[notice] budget is low")
    assert message.text == "[notice] budget is low"
    assert message.is_notice


def test_message_notice_prefix_needs_the_space() -> None:
    # "[notice]x" does not start with "[notice] ", so the prefix is added.
    assert Message.notice("[notice]x").text == "[notice] [notice]x"


def test_is_notice_for_a_user_message_built_by_hand() -> None:
    assert Message("user", (TextBlock("[notice] hi"),)).is_notice
    assert not Message("user", (TextBlock("notice: hi"),)).is_notice


def test_assistant_message_is_never_a_notice() -> None:
    assert not Message.assistant("[notice] hi").is_notice


def test_message_assistant_defaults() -> None:
    message = Message.assistant()
    assert message.role == "assistant"
    assert message.content == ()
    assert message.text == ""
    assert message.tool_calls == ()


def test_message_assistant_with_text_and_calls() -> None:
    calls = [ToolCall("c1", "a", {"x": 1}), ToolCall("c2", "b", {})]
    message = Message.assistant("Let me look.", calls)
    assert message.content == (TextBlock("Let me look."), *calls)
    assert message.tool_calls == tuple(calls)
    assert message.text == "Let me look."


def test_message_assistant_with_calls_only() -> None:
    call = ToolCall("c1", "a", {})
    message = Message.assistant(tool_calls=[call])
    assert message.content == (call,)


def test_message_assistant_rejects_non_tool_calls() -> None:
    with pytest.raises(TypeError, match="ToolCall"):
        Message.assistant("x", as_any([{"id": "c1", "name": "a"}]))


def test_messages_compare_by_value_and_hash() -> None:
    a = Message.assistant("x", [ToolCall("c1", "f", {"a": [1, {"b": 2}]})])
    b = Message.assistant("x", [ToolCall("c1", "f", {"a": [1, {"b": 2}]})])
    assert a == b
    assert hash(a) == hash(b)
    assert a != Message.assistant("y")


# -- TextBlock / ReasoningBlock ----------------------------------------------------------------


def test_text_block_holds_text() -> None:
    block = TextBlock("hello")
    assert block.text == "hello"
    assert block.kind == "text"


@pytest.mark.parametrize("cls", [TextBlock, ReasoningBlock])
def test_text_like_blocks_reject_non_str(cls: Any) -> None:
    with pytest.raises(TypeError):
        cls(b"bytes")


def test_reasoning_block_holds_text() -> None:
    block = ReasoningBlock("step 1")
    assert block.text == "step 1"
    assert block.kind == "reasoning"
    assert block != TextBlock("step 1")


# -- Image -------------------------------------------------------------------------------------


def test_image_holds_bytes_and_media_type() -> None:
    image = _png()
    assert image.data == PNG_BYTES
    assert image.media_type == "image/png"
    assert image.kind == "image"


@pytest.mark.parametrize("media_type", ["image/png", "image/jpeg", "image/gif", "image/webp"])
def test_image_accepts_common_media_types(media_type: str) -> None:
    assert Image(b"x", media_type).media_type == media_type


@pytest.mark.parametrize("media_type", ["image/bmp", "text/plain", "png", ""])
def test_image_rejects_unsupported_media_type(media_type: str) -> None:
    with pytest.raises(ValueError, match="media_type"):
        Image(b"x", media_type)


@pytest.mark.parametrize("data", ["text", bytearray(b"x"), memoryview(b"x"), None])
def test_image_data_must_be_bytes(data: object) -> None:
    with pytest.raises(TypeError, match="bytes"):
        Image(as_any(data), "image/png")


def test_image_from_path_reads_bytes_and_guesses_png(tmp_path: Path) -> None:
    path = tmp_path / "picture.png"
    path.write_bytes(PNG_BYTES)
    image = Image.from_path(path)
    assert image.data == PNG_BYTES
    assert image.media_type == "image/png"
    assert Image.from_path(str(path)) == image


def test_image_from_path_with_explicit_media_type(tmp_path: Path) -> None:
    path = tmp_path / "picture.bin"
    path.write_bytes(b"\xff\xd8\xff")
    image = Image.from_path(path, "image/jpeg")
    assert image.media_type == "image/jpeg"
    assert image.data == b"\xff\xd8\xff"


def test_image_from_path_unknown_extension_names_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "picture.zzqq"
    path.write_bytes(PNG_BYTES)
    with pytest.raises(ValueError, match="media_type") as info:
        Image.from_path(path)
    message = str(info.value)
    assert "picture.zzqq" in message
    # The message must list the supported types, not a raw format placeholder.
    assert "{_IMAGE_TYPES}" not in message
    assert "image/jpeg" in message


def test_image_from_path_non_image_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"hello")
    with pytest.raises(ValueError, match="text/plain"):
        Image.from_path(path)


def test_image_from_base64_round_trip() -> None:
    text = base64.b64encode(PNG_BYTES).decode("ascii")
    image = Image.from_base64(text, "image/png")
    assert image.data == PNG_BYTES
    assert image.media_type == "image/png"
    assert image.to_base64() == text


@pytest.mark.parametrize("text", ["!!!not base64!!!", "abc", "aGVsbG8=\x00"])
def test_image_from_base64_invalid_text(text: str) -> None:
    with pytest.raises(ValueError, match="base64"):
        Image.from_base64(text, "image/png")


def test_image_from_base64_bad_media_type() -> None:
    with pytest.raises(ValueError, match="media_type"):
        Image.from_base64("aGVsbG8=", "application/pdf")


def test_image_repr_does_not_dump_bytes() -> None:
    image = _png()
    text = repr(image)
    assert len(text) < 80
    assert "image/png" in text
    assert str(len(PNG_BYTES)) in text
    assert "\\x89" not in text
    assert "PNG" not in text


# -- ToolCall ----------------------------------------------------------------------------------


def test_tool_call_fields() -> None:
    call = ToolCall("c1", "search", {"q": "x", "limit": 3})
    assert call.id == "c1"
    assert call.name == "search"
    assert call.args == {"q": "x", "limit": 3}
    assert call.kind == "tool_call"


def test_tool_call_args_default_to_empty_frozen_dict() -> None:
    call = ToolCall("c1", "noop")
    assert call.args == {}
    assert is_a(call.args, FrozenDict)


def test_tool_call_args_are_frozen_deeply() -> None:
    call = ToolCall("c1", "f", {"items": [1, {"k": "v"}], "opts": {"a": 1}})
    assert is_a(call.args, FrozenDict)
    assert is_a(call.args["items"], FrozenList)
    assert is_a(call.args["items"][1], FrozenDict)
    assert is_a(call.args["opts"], FrozenDict)
    args: Any = call.args
    with pytest.raises(TypeError):
        args["new"] = 1
    with pytest.raises(TypeError):
        args["items"].append(2)
    with pytest.raises(TypeError):
        args["opts"]["a"] = 2
    assert call.args == {"items": [1, {"k": "v"}], "opts": {"a": 1}}


def test_tool_call_args_given_as_a_hand_built_frozen_dict_are_deeply_frozen() -> None:
    inner = [1]
    call = ToolCall("c1", "f", FrozenDict[str, Any]({"items": inner}))
    inner.append(2)
    assert call.args == {"items": [1]}
    args: Any = call.args
    with pytest.raises(TypeError):
        args["items"].append(3)


def test_tool_call_copies_the_args_it_is_given() -> None:
    args: dict[str, Any] = {"items": [1, 2]}
    call = ToolCall("c1", "f", as_any(args))
    args["items"].append(3)
    args["other"] = True
    assert call.args == {"items": [1, 2]}


def test_tool_call_tuple_args_become_lists() -> None:
    call = ToolCall("c1", "f", as_any({"pair": (1, 2)}))
    assert call.args["pair"] == [1, 2]
    assert is_a(call.args["pair"], FrozenList)


@pytest.mark.parametrize("args", [[1, 2], "x=1", 3, None, (("a", 1),)])
def test_tool_call_args_must_be_a_dict(args: object) -> None:
    with pytest.raises(TypeError, match="args"):
        ToolCall("c1", "f", as_any(args))


@pytest.mark.parametrize(
    ("args", "path"),
    [
        ({"a": {1, 2}}, "['a']"),
        ({"a": [1, b"raw"]}, "['a'][1]"),
        ({"a": {"b": float("nan")}}, "['a']['b']"),
        ({"a": object()}, "['a']"),
    ],
)
def test_tool_call_non_json_args_name_the_path(args: dict[str, Any], path: str) -> None:
    with pytest.raises(TypeError) as info:
        ToolCall("c1", "f", as_any(args))
    assert path in str(info.value)
    assert "args" in str(info.value)


@pytest.mark.parametrize(("call_id", "name"), [(1, "f"), ("c1", None)])
def test_tool_call_id_and_name_must_be_str(call_id: object, name: object) -> None:
    with pytest.raises(TypeError):
        ToolCall(as_any(call_id), as_any(name), {})


def test_tool_call_hashable_and_equal_by_value() -> None:
    a = ToolCall("c1", "f", {"a": [1, 2]})
    b = ToolCall("c1", "f", {"a": [1, 2]})
    assert a == b
    assert hash(a) == hash(b)
    assert a != ToolCall("c1", "f", {"a": [2, 1]})


# -- ToolResultBlock ---------------------------------------------------------------------------


def test_tool_result_str_content_becomes_a_text_block() -> None:
    block = ToolResultBlock("c1", as_any("42 results"))
    assert block.content == (TextBlock("42 results"),)
    assert block.text == "42 results"
    assert block.is_error is False
    assert block.kind == "tool_result"


def test_tool_result_blocks_content_becomes_a_tuple() -> None:
    image = _png()
    block = ToolResultBlock("c1", as_any([TextBlock("a"), image, TextBlock("b")]), is_error=True)
    assert block.content == (TextBlock("a"), image, TextBlock("b"))
    assert block.text == "ab"
    assert block.is_error is True


@pytest.mark.parametrize(
    "content",
    [
        ["plain str item"],
        [ToolCall("c2", "f", {})],
        [ReasoningBlock("r")],
        [{"type": "text", "text": "x"}],
    ],
)
def test_tool_result_rejects_bad_items(content: list[object]) -> None:
    with pytest.raises(TypeError, match="ToolResultBlock"):
        ToolResultBlock("c1", as_any(content))


def test_tool_result_rejects_non_iterable_content() -> None:
    with pytest.raises(TypeError):
        ToolResultBlock("c1", as_any(5))


def test_tool_result_call_id_must_be_str() -> None:
    with pytest.raises(TypeError):
        ToolResultBlock(as_any(7), as_any("x"))


# -- RawBlock ----------------------------------------------------------------------------------


def test_raw_block_data_is_frozen() -> None:
    block = RawBlock("anthropic", {"type": "thinking", "signature": "abc", "parts": [1, 2]})
    assert block.provider == "anthropic"
    assert block.kind == "raw"
    assert block.data == {"type": "thinking", "signature": "abc", "parts": [1, 2]}
    assert is_a(block.data, FrozenDict)
    with pytest.raises(TypeError):
        block.data["type"] = "text"
    with pytest.raises(TypeError):
        block.data["parts"].append(3)


def test_raw_block_copies_its_input() -> None:
    data: dict[str, Any] = {"parts": [1]}
    block = RawBlock("openai", data)
    data["parts"].append(2)
    assert block.data == {"parts": [1]}


def test_raw_block_rejects_non_json() -> None:
    with pytest.raises(TypeError, match="RawBlock"):
        RawBlock("openai", {"blob": b"\x00"})


def test_raw_block_provider_must_be_str() -> None:
    with pytest.raises(TypeError):
        RawBlock(as_any(None), {})


# -- frozen dataclasses ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "attribute", "new"),
    [
        (Message.user("hi"), "role", "assistant"),
        (Message.user("hi"), "content", ()),
        (TextBlock("a"), "text", "b"),
        (Image(b"x", "image/png"), "data", b"y"),
        (Image(b"x", "image/png"), "media_type", "image/gif"),
        (ToolCall("c1", "f", {}), "args", {"a": 1}),
        (ToolCall("c1", "f", {}), "name", "g"),
        (ToolResultBlock("c1", as_any("x")), "is_error", True),
        (ReasoningBlock("r"), "text", "s"),
        (RawBlock("p", {}), "data", {"a": 1}),
    ],
)
def test_blocks_and_messages_reject_attribute_assignment(
    value: object, attribute: str, new: object
) -> None:
    before = getattr(value, attribute)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, attribute, new)
    assert getattr(value, attribute) == before
