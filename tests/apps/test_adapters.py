"""The protocol adapters' mapping, event by event (the official clients read them in
test_protocol_clients.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

from orchestrator import (
    ApprovalNeeded,
    AwaitingInfo,
    CallInfo,
    ChildStarted,
    Event,
    ModelReplied,
    RateLimitWaited,
    Retrying,
    RunEnded,
    RunStarted,
    TextDelta,
    ToolDeferred,
    ToolEnded,
)
from orchestrator.apps.agui import AGUIStream, agui_events, encode
from orchestrator.apps.vercel import DONE, VercelStream, vercel_chunks, vercel_sse

AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
CALL = CallInfo(id="c1", name="helper", args={"task": "dig"})
DEEP = CallInfo(id="c2", name="digger", args={})


def _tree() -> list[Event]:
    """A root whose subagent starts its own subagent, which fails; the middle one retries."""
    return [
        RunStarted(at=AT, state_id="root", agent="lead"),
        ModelReplied(at=AT, state_id="root", text="", tool_calls=[CALL]),
        ChildStarted(
            at=AT, state_id="mid", parent_id="root", parent_call_id="c1", call_id="c1", agent="h"
        ),
        RunStarted(at=AT, state_id="mid", parent_id="root", parent_call_id="c1", agent="h"),
        Retrying(at=AT, state_id="mid", parent_id="root", attempt=1, delay=0.5, error="Boom: once"),
        TextDelta(at=AT, state_id="mid", parent_id="root", text="dig"),
        ModelReplied(at=AT, state_id="mid", parent_id="root", text="dig", tool_calls=[DEEP]),
        ChildStarted(
            at=AT, state_id="deep", parent_id="mid", parent_call_id="c2", call_id="c2", agent="d"
        ),
        RunStarted(at=AT, state_id="deep", parent_id="mid", parent_call_id="c2", agent="d"),
        RunEnded(at=AT, state_id="deep", parent_id="mid", error="RuntimeError: no shovel"),
        ToolEnded(
            at=AT,
            state_id="mid",
            parent_id="root",
            call_id="c2",
            name="digger",
            outcome="error",
            result="(a subagent of this call failed)",
            is_error=True,
        ),
        RunEnded(at=AT, state_id="mid", parent_id="root", answer="gave up", stop_kind="until"),
        ToolEnded(
            at=AT, state_id="root", call_id="c1", name="helper", outcome="done", result="gave up"
        ),
        TextDelta(at=AT, state_id="root", text="It gave "),
        TextDelta(at=AT, state_id="root", text="up."),
        RunEnded(at=AT, state_id="root", answer="It gave up.", stop_kind="until"),
    ]


def _agui(events: list[Event], **options: Any) -> list[dict[str, Any]]:
    stream = AGUIStream(**options)
    return [
        item.model_dump(by_alias=True, exclude_none=True) for e in events for item in stream.feed(e)
    ]


def test_ag_ui_nests_subagents_and_reports_their_failure_and_retries() -> None:
    out = _agui(_tree(), run_id="r")
    types = [item["type"] for item in out]
    assert types[0] == "RUN_STARTED"
    assert out[0]["threadId"] == "root"
    assert types[-1] == "RUN_FINISHED"
    started = {item["subagentRunId"]: item for item in out if item["type"] == "SUBAGENT_STARTED"}
    assert started["mid"]["parentToolCallId"] == "c1"
    assert "parentSubagentRunId" not in started["mid"]  # the root's own subagent
    assert started["deep"]["parentSubagentRunId"] == "mid"
    assert started["deep"]["parentToolCallId"] == "c2"
    (error,) = [item for item in out if item["type"] == "SUBAGENT_ERROR"]
    assert (error["subagentRunId"], error["message"]) == ("deep", "RuntimeError: no shovel")
    (finished,) = [item for item in out if item["type"] == "SUBAGENT_FINISHED"]
    assert (finished["subagentRunId"], finished["result"]) == ("mid", "gave up")
    (retry,) = [item for item in out if item["type"] == "CUSTOM"]
    assert retry["name"] == "orchestrator.retry"
    assert retry["value"]["attempt"] == 1
    assert retry["subagentRunId"] == "mid"
    texts = [item for item in out if item["type"].startswith("TEXT_MESSAGE")]
    assert all(item.get("subagentRunId") == "mid" for item in texts[:3])
    content = [item["delta"] for item in out if item["type"] == "TEXT_MESSAGE_CONTENT"]
    assert content == ["dig", "It gave ", "up."]
    assert out[-1]["timestamp"] == int(AT.timestamp() * 1000)
    assert out[-1]["result"] == "It gave up."


def test_ag_ui_numbers_the_runs_of_a_thread_and_reports_errors() -> None:
    events: list[Event] = [
        RunStarted(at=AT, state_id="s"),
        RunEnded(at=AT, state_id="s", answer="a", stop_kind="until"),
        RunStarted(at=AT, state_id="s"),
        TextDelta(at=AT, state_id="s", text="half"),
        RunEnded(at=AT, state_id="s", error="RuntimeError: down", usage={"input_tokens": 3}),
    ]
    out = _agui(events, run_id="r", thread_id="t")
    assert [(item["type"], item.get("runId")) for item in out] == [
        ("RUN_STARTED", "r"),
        ("RUN_FINISHED", "r"),
        ("RUN_STARTED", "r-2"),
        ("TEXT_MESSAGE_START", None),
        ("TEXT_MESSAGE_CONTENT", None),
        ("TEXT_MESSAGE_END", None),  # the text a failed run left open is closed
        ("RUN_ERROR", None),
    ]
    assert {item.get("threadId") for item in out if "runId" in item} == {"t"}
    assert out[-1]["usage"] == [{"inputTokens": 3}]


def test_ag_ui_interrupts_list_the_waiting_calls_of_the_tree() -> None:
    send = CallInfo(id="c9", name="send", args={"to": "bob"})
    events: list[Event] = [
        RunStarted(at=AT, state_id="s"),
        ModelReplied(at=AT, state_id="s", text="", tool_calls=[send]),
        ToolDeferred(at=AT, state_id="s", call_id="c9", name="send", args={}, reason="mail"),
        ApprovalNeeded(
            at=AT,
            state_id="s",
            calls=[
                AwaitingInfo(state_id="s", call=send, reason="mail"),
                AwaitingInfo(state_id="kid", call=DEEP),
            ],
        ),
        RunEnded(at=AT, state_id="s", stop_kind="approval"),
    ]
    out = _agui(events)
    interrupts = out[-1]["outcome"]["interrupts"]
    assert [(i["id"], i.get("subagentRunId"), i.get("message")) for i in interrupts] == [
        ("c9", None, "mail"),
        ("c2", "kid", None),
    ]
    assert encode(AGUIStream().feed(events[0])[0]).startswith(b"data: {")
    kid: list[Event] = [
        ChildStarted(at=AT, state_id="kid", parent_id="s", call_id="c1", agent="k"),
        ApprovalNeeded(at=AT, state_id="kid", calls=[AwaitingInfo(state_id="kid", call=DEEP)]),
        RunEnded(at=AT, state_id="kid", stop_kind="approval"),
    ]
    finished = _agui([events[0], *kid])[-1]
    assert finished["type"] == "SUBAGENT_FINISHED"
    assert finished["outcome"] == {"type": "suspended", "interruptIds": ["c2"]}


@pytest.mark.anyio
async def test_the_generators_end_with_their_input() -> None:
    async def events() -> AsyncIterator[Event]:
        for event in _tree():
            yield event

    kinds = [item.type for item in [x async for x in agui_events(events())]]
    assert kinds[-1] == "RUN_FINISHED"
    chunks = [chunk async for chunk in vercel_chunks(events())]
    assert chunks[-1]["type"] == "finish"

    async def cut_off() -> AsyncIterator[Event]:  # the root's run never ends in it
        yield RunStarted(at=AT, state_id="s")
        yield TextDelta(at=AT, state_id="s", text="hal")

    body = b"".join([data async for data in vercel_sse(cut_off())])
    assert body.endswith(
        b'"type":"text-end","id":"s-p1"}\n\ndata: {"type":"finish-step"}\n\n'
        b'data: {"type":"finish","finishReason":"other"}\n\n' + DONE
    )


def test_vercel_children_are_data_parts_with_their_links() -> None:
    stream = VercelStream(message_id="m")
    out = [chunk for event in _tree() for chunk in stream.feed(event)]
    assert out[0] == {"type": "start", "messageId": "m"}
    parts = [chunk for chunk in out if chunk["type"] == "data-subagent"]
    last = {chunk["id"]: chunk["data"] for chunk in parts}
    assert last["deep"]["status"] == "failed"
    assert last["deep"]["error"] == "RuntimeError: no shovel"
    assert (last["deep"]["parent_id"], last["deep"]["parent_call_id"]) == ("mid", "c2")
    assert last["mid"]["status"] == "done"
    assert last["mid"]["answer"] == "gave up"
    assert last["mid"]["text"] == "dig"
    assert [chunk["data"]["attempt"] for chunk in out if chunk["type"] == "data-retry"] == [1]
    # The child's tool calls are not parts of the root's message; the root's are.
    inputs = [chunk["toolCallId"] for chunk in out if chunk["type"] == "tool-input-available"]
    assert inputs == ["c1"]
    assert stream.done
    assert stream.feed(RunStarted(at=AT, state_id="root")) == []
    assert stream.end() == []


def test_a_wait_for_a_rate_limit_is_a_transient_notice_in_both_adapters() -> None:
    events: list[Event] = [
        RunStarted(at=AT, state_id="root"),
        RateLimitWaited(at=AT, state_id="root", limit="openai", delay=0.25),
        RunEnded(at=AT, state_id="root", answer="ok", stop_kind="until"),
    ]
    (custom,) = [item for item in _agui(events, run_id="r") if item["type"] == "CUSTOM"]
    assert (custom["name"], custom["value"]) == (
        "orchestrator.rate_limit",
        {"limit": "openai", "delay": 0.25},
    )
    stream = VercelStream(message_id="m")
    out = [chunk for event in events for chunk in stream.feed(event)]
    assert [chunk for chunk in out if chunk["type"] == "data-rate-limit"] == [
        {
            "type": "data-rate-limit",
            "data": {"state_id": "root", "limit": "openai", "delay": 0.25},
            "transient": True,
        }
    ]
