"""`orchestrator.testing.FakeModel`: the scripted model the test suites of agents run on."""

from __future__ import annotations

import pytest

from orchestrator import Message, RawBlock
from orchestrator.models import Request
from orchestrator.testing import FakeModel, tool_call


@pytest.mark.anyio
async def test_fake_model_takes_a_list_of_calls_and_blocks_including_raw_blocks() -> None:
    # DESIGN 11 FakeModel items: "a list of calls and blocks (one reply)"; DESIGN 4 blocks include
    # RawBlock(provider, data).
    raw = RawBlock("fake", {"signature": "abc"})
    call = tool_call("search", q="x")
    model = FakeModel([[raw, "Searching", call]])
    reply = await model.respond(Request(system=None, messages=(Message.user("go"),)))
    assert reply.message.content[0] == raw
    assert reply.message.tool_calls == (call,)
    assert reply.message.text == "Searching"
