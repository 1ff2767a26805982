"""`ReplayModel`: a recorded tree answers its own requests again, and the first difference shows."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

import pytest

from orchestrator import (
    Agent,
    HistoryEntry,
    Message,
    ModelRequest,
    ModelRequestEntry,
    RateLimitError,
    Reply,
    State,
    Usage,
    loop,
    tool,
)
from orchestrator.models import Request
from orchestrator.testing import FakeModel, ReplayMismatch, ReplayModel, tool_call
from stores import AioSQLiteStore, FileStore, SQLiteStore
from tests.cli.team import NOTES, QUESTION, build, build_changed, deciding_model, record

pytestmark = pytest.mark.anyio


async def record_in_memory() -> State:
    state = State(messages=[Message.user(QUESTION)])
    await build(deciding_model())["lead"].arun(state)
    return state


@tool
def shout(text: str) -> str:
    """Say it loud."""
    return text.upper()


class TunedModel(FakeModel):
    """A fake model with options, as a provider model has."""

    def __init__(self, replies: list[Any], *, temperature: float) -> None:
        super().__init__(replies)
        self.temperature = temperature

    @property
    def options(self) -> dict[str, Any]:
        return {"temperature": self.temperature}


def children_of(state: State) -> list[str]:
    return [
        child for entry in state.history if entry.kind == "tool_result" for child in entry.child_ids
    ]


async def test_a_tree_in_memory_replays_with_each_subagent_its_own_replies() -> None:
    recorded = await record_in_memory()
    model = ReplayModel(recorded)
    assert model.state_ids == (recorded.id, *children_of(recorded))
    assert (model.answered, model.remaining) == (0, 6)

    replayed = State(messages=[Message.user(QUESTION)])
    answer = await build(model)["lead"].arun(replayed)

    assert answer == recorded.answer
    assert replayed.messages == recorded.messages
    assert (model.answered, model.remaining, model.mismatch) == (6, 0, None)
    model.check()

    # The subagents end in any order: compare them by their task.
    def by_task(state: State) -> dict[str, Any]:
        children = [state.child(child) for child in children_of(state)]
        return {child.messages[0].text: child.messages for child in children}

    assert by_task(replayed) == by_task(recorded)
    assert {request.system for request in model.requests} == {"Split the question.", None}


@pytest.mark.parametrize("backend", ["file", "sqlite"])
async def test_a_tree_replays_from_a_store(backend: str, tmp_path: Path) -> None:
    store: Any = (
        FileStore(tmp_path / "runs") if backend == "file" else SQLiteStore(tmp_path / "r.db")
    )
    await replay_from(store)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # aiosqlite works on asyncio only
async def test_a_tree_replays_from_an_async_only_store(tmp_path: Path) -> None:
    await replay_from(AioSQLiteStore(tmp_path / "runs.db"))


async def replay_from(store: Any) -> None:
    recorded = await record(store)
    model = await ReplayModel.aload(store, recorded.id)
    assert len(model.state_ids) == 3

    answer = await build(model)["lead"].arun(QUESTION)

    assert answer == recorded.answer
    model.check()
    close = getattr(store, "aclose", None)
    if close is not None:
        await close()


def test_load_opens_the_tree_from_a_sync_store(tmp_path: Path) -> None:
    import anyio

    with SQLiteStore(tmp_path / "runs.db") as store:
        recorded = anyio.run(record, store)
        model = ReplayModel.load(store, recorded.id, name="again")
    assert model.name == "again"
    assert model.context_window is None
    assert build(model)["lead"].run(QUESTION) == recorded.answer
    model.check()


async def test_a_tool_that_answers_otherwise_is_the_first_difference() -> None:
    recorded = await record_in_memory()
    model = ReplayModel(recorded)

    with pytest.raises(ReplayMismatch) as raised:
        await build_changed(model)["lead"].arun(QUESTION)

    # The first difference is in the second request of the researcher that asked first; the
    # lead, which then saw its subagents fail, stops on the same message.
    text = str(raised.value)
    assert model.mismatch is not None
    assert text == str(model.mismatch)
    (child,) = [recorded.child(child_id) for child_id in children_of(recorded) if child_id in text]
    topic = child.messages[0].text
    assert f"request 2 of 2 of State {child.id} (agent 'researcher'): message 2 differs" in text
    assert f"Expected: {NOTES[topic]!r} Got: {NOTES[topic].upper()!r}" in text
    with pytest.raises(ReplayMismatch, match="message 2 differs"):
        model.check()


async def test_another_prompt_differs_at_the_lead_first_request() -> None:
    recorded = await record_in_memory()
    model = ReplayModel(recorded)

    with pytest.raises(ReplayMismatch) as raised:
        await build(model)["lead"].arun("Why are refunds slow?")

    text = str(raised.value)
    assert f"request 1 of 2 of State {recorded.id} (agent 'lead'): message 0 differs" in text
    assert "Its block 0 (text) differs" in text
    assert "Expected: 'Why are refunds paid twice?' Got: 'Why are refunds slow?'" in text
    with pytest.raises(ReplayMismatch, match="message 0 differs"):  # and every request after
        await model.respond(Request(system=None, messages=[Message.user(QUESTION)]))


async def test_changed_instructions_are_the_first_difference_with_a_diff() -> None:
    recorded = await record_in_memory()
    model = ReplayModel(recorded)
    team = build(model)
    lead = team["lead"].copy(instructions="Split the question in three.")

    with pytest.raises(ReplayMismatch) as raised:
        await lead.arun(QUESTION)

    assert str(raised.value) == (
        f"The request differs from the recording at request 1 of 2 of State {recorded.id}"
        " (agent 'lead'): the instructions differ:\n--- recorded\n+++ now\n@@ -1 +1 @@\n"
        "-Split the question.\n+Split the question in three."
    )


async def test_a_changed_tool_description_is_a_difference_naming_the_tool() -> None:
    recorded = State(messages=[Message.user("Go")])
    await Agent(FakeModel([tool_call("shout", text="hi"), "HI"]), tools=[shout]).arun(recorded)
    model = ReplayModel(recorded)

    @tool(name="shout")
    def quieter(text: str) -> str:
        """Say it softly."""
        return text

    with pytest.raises(ReplayMismatch) as raised:
        await Agent(model, tools=[quieter]).arun("Go")

    text = str(raised.value)
    assert "request 1 of 2" in text
    assert "the specs of the tool 'shout' differ:" in text
    assert '- "description": "Say it loud.",' in text
    assert '+ "description": "Say it softly.",' in text


async def test_options_are_compared_when_the_replay_is_given_them() -> None:
    recorded = State(messages=[Message.user("Go")])
    await Agent(TunedModel(["ok"], temperature=0.2)).arun(recorded)

    same = ReplayModel(recorded, options={"temperature": 0.2})
    await Agent(same).arun("Go")
    same.check()
    unchecked = ReplayModel(recorded)  # the replay model stands in: options not compared
    await Agent(unchecked).arun("Go")
    unchecked.check()

    warmer = ReplayModel(recorded, options={"temperature": 0.9})
    with pytest.raises(ReplayMismatch, match=r"the options differ:(.|\n)*\+ \"temperature\": 0.9"):
        await Agent(warmer).arun("Go")


async def test_a_history_without_prompts_compares_the_tool_names_only() -> None:
    recorded = State(messages=[Message.user("Go")])
    await Agent(FakeModel(["ok"]), instructions="Be brief.").arun(recorded)
    old: list[HistoryEntry] = []
    for entry in recorded.history:
        if entry.kind == "prompt":
            continue
        entry = dataclasses.replace(entry, seq=len(old))
        if isinstance(entry, ModelRequestEntry):
            entry = dataclasses.replace(entry, content=ModelRequest(message_count=1))
        old.append(entry)
    model = ReplayModel(State(history=old))
    await Agent(model, instructions="Be long.").arun("Go")
    model.check()


async def test_a_long_text_is_shown_around_its_first_difference() -> None:
    prompt = "x" * 500 + "the end"
    recorded = State(messages=[Message.user(prompt)])
    await Agent(FakeModel(["ok"])).arun(recorded)
    model = ReplayModel(recorded)

    with pytest.raises(ReplayMismatch) as raised:
        await Agent(model).arun(prompt.replace("end", "END"))

    text = str(raised.value)
    # 80 characters before the first difference, at "e" of "end"
    assert "Expected: ...'" + "x" * 76 + "the end' Got: ...'" + "x" * 76 + "the END'" in text


async def test_an_added_tool_is_a_difference() -> None:
    recorded = await record_in_memory()
    model = ReplayModel(recorded)

    @tool
    def extra() -> str:
        """One more tool."""
        return ""

    team = build(model)
    lead = team["lead"].copy(tools=[*team["lead"].tools, extra])
    with pytest.raises(ReplayMismatch) as raised:
        await lead.arun(QUESTION)

    assert str(raised.value).endswith(
        "the tools differ. Expected: researcher. Got: researcher, extra."
    )


async def test_an_extra_or_a_missing_message_is_named() -> None:
    recorded = State(messages=[Message.user("one"), Message.user("two")])
    await Agent(FakeModel(["ok"])).arun(recorded)

    extra = ReplayModel(recorded)
    with pytest.raises(ReplayMismatch) as raised:
        await Agent(extra).arun(
            State(messages=[Message.user("one"), Message.user("two"), Message.user("three")])
        )
    assert "it has 3 messages, the recording 2; message 2 is extra. Got: user: 'three'" in str(
        raised.value
    )

    missing = ReplayModel(recorded)
    with pytest.raises(ReplayMismatch) as raised:
        await Agent(missing).arun(State(messages=[Message.user("one")]))
    assert "it has 1 messages, the recording 2; message 1 is missing. Expected: user: 'two'" in (
        str(raised.value)
    )


async def test_a_replay_that_stops_early_fails_the_check() -> None:
    recorded = await record_in_memory()
    model = ReplayModel(recorded)
    lead = build(model)["lead"].copy(max_turns=1)

    await lead.arun(QUESTION)  # the researchers ran; the lead never asked its second request

    assert model.remaining == 1
    with pytest.raises(ReplayMismatch) as raised:
        model.check()
    assert (
        f"asked fewer requests than the recording: State {recorded.id} asked 1 of its 2;"
        f" request 2 of 2 of State {recorded.id} (agent 'lead') was never asked"
        in str(raised.value)
    )


async def test_a_request_after_the_recording_ended_is_a_difference() -> None:
    recorded = await record_in_memory()
    model = ReplayModel(recorded)
    lead = build(model)["lead"]
    state = State(messages=[Message.user(QUESTION)])
    await lead.arun(state)
    state.add_message(Message.user("And then?"))

    with pytest.raises(ReplayMismatch, match="asked more often than in the recording") as raised:
        await lead.arun(state)
    assert "the last: user: 'And then?'" in str(raised.value)


async def test_a_recorded_model_error_is_raised_again() -> None:
    recorded = State(messages=[Message.user("hi")])
    with pytest.raises(RateLimitError):
        await Agent(FakeModel([RateLimitError("slow down")])).arun(recorded)
    model = ReplayModel(recorded)

    with pytest.raises(RateLimitError, match=r"^slow down$"):
        await Agent(model).arun("hi")
    model.check()


async def test_a_loop_that_retried_after_an_error_replays_the_same_way() -> None:
    @loop(limit=5)
    async def retrying(agent: Agent, state: State) -> None:
        try:
            await agent.athink(state)
        except RateLimitError:
            await agent.athink(state)
        state.finish()

    recorded = State(messages=[Message.user("hi")])
    await Agent(FakeModel([RateLimitError("slow down"), "hello"]), loop=retrying).arun(recorded)
    model = ReplayModel(recorded)

    replayed = State(messages=[Message.user("hi")])
    await Agent(model, loop=retrying).arun(replayed)

    assert replayed.messages == recorded.messages
    assert model.answered == 2
    model.check()


async def test_subagents_with_the_same_task_keep_their_own_replies() -> None:
    """Twins ask the same first request; each next request shows which recording it follows."""
    queries = itertools.count()

    def decide(request: Request) -> Reply:
        first, last = request.messages[0].text, request.messages[-1]
        if first == QUESTION:
            if last.tool_results:
                return Reply(Message.assistant(" / ".join(r.text for r in last.tool_results)))
            return Reply(
                Message.assistant(
                    "",
                    [tool_call("researcher", task="same")] * 1
                    + [tool_call("researcher", task="same")],
                )
            )
        if last.tool_results:
            return Reply(Message.assistant(f"found {last.tool_results[0].text}"))
        return Reply(Message.assistant("", [tool_call("search", query=f"q{next(queries)}")]))

    recorded = State(messages=[Message.user(QUESTION)])
    await build(FakeModel([decide] * 10))["lead"].arun(recorded)
    twins = [recorded.child(child).messages[1] for child in children_of(recorded)]
    assert twins[0] != twins[1]  # the same request got two different replies

    model = ReplayModel(recorded)
    replayed = State(messages=[Message.user(QUESTION)])
    await build(model)["lead"].arun(replayed)

    model.check()
    assert replayed.messages == recorded.messages


async def test_streamed_text_reaches_on_text() -> None:
    recorded = State(messages=[Message.user("hi")])
    await Agent(FakeModel([Reply(Message.assistant("hello"), Usage(requests=1))])).arun(recorded)
    model = ReplayModel(recorded)
    chunks: list[str] = []

    reply = await model.respond(
        Request(system=None, messages=[Message.user("hi")]), on_text=chunks.append
    )

    assert chunks == ["hello"]
    assert reply.usage == Usage(requests=1)


def test_a_replay_needs_a_state_and_its_children() -> None:
    with pytest.raises(TypeError, match="ReplayModel takes a saved State"):
        ReplayModel("not a state")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]

    import anyio

    recorded = anyio.run(record_in_memory)
    copy = State(history=recorded.history)  # the history alone: its children are elsewhere
    with pytest.raises(ValueError, match="not in memory and this State has no store"):
        ReplayModel(copy)


async def test_aload_reads_a_sync_store_off_the_event_loop() -> None:
    import threading

    from tests.doubles import ThreadCheckedStore

    store = ThreadCheckedStore()
    recorded = await record(store)
    store.loop_thread = threading.get_ident()

    model = await ReplayModel.aload(store, recorded.id)

    assert store.calls.count("load") == 3  # the lead and its two researchers
    assert store.on_loop == []
    assert await build(model)["lead"].arun(QUESTION) == recorded.answer


async def test_a_difference_inside_a_message_names_the_block() -> None:
    from orchestrator import Image

    png = Image(b"\x89PNG....", "image/png")
    cases = [
        # (recorded messages, replayed messages, what the difference says)
        (
            [Message.user("hi"), Message.assistant("hello"), Message.user("go")],
            [Message.user("hi"), Message.user("hello"), Message.user("go")],
            "message 1 differs. Expected: assistant: 'hello' Got: user: 'hello'",
        ),
        (
            [Message.user("look", png)],
            [Message.user("look")],
            "message 0 differs. It lacks block 1. Expected: image (image/png, 8 bytes)",
        ),
        (
            [Message.user("look")],
            [Message.user("look", png)],
            "message 0 differs. It has an extra block 1. Got: image (image/png, 8 bytes)",
        ),
        (
            [Message.user("look", png)],
            [Message("user", (png, png))],
            "message 0 differs. Its block 0 differs. Expected: 'look' Got: image (image/png,",
        ),
        (
            [Message.user("abc")],
            [Message.user("abcd")],
            "message 0 differs. Its block 0 (text) differs. Expected: 'abc' Got: 'abcd'",
        ),
    ]
    for want, got, difference in cases:
        recorded = State(messages=want)
        await Agent(FakeModel(["ok"])).arun(recorded)
        model = ReplayModel(recorded)
        with pytest.raises(ReplayMismatch) as raised:
            await Agent(model).arun(State(messages=got))
        assert difference in str(raised.value)


def test_describe_message_shows_every_kind_of_block() -> None:
    from orchestrator import Image, RawBlock, ReasoningBlock, TextBlock, ToolResultBlock
    from orchestrator.testing._replay import describe_message  # private: the unit under test

    message = Message(
        "assistant",
        (
            ReasoningBlock("thinking"),
            TextBlock("some text"),
            tool_call("read", path="a.txt", n=2),
            ToolResultBlock("call_9", (TextBlock("failed"),), is_error=True),
            Image(b"12", "image/png"),
            RawBlock("anthropic", {"x": 1}),
        ),
    )

    text = describe_message(message)

    assert text.startswith("assistant: reasoning 'thinking'; 'some text'; call read(")
    assert '{"n": 2, "path": "a.txt"}) [call_' in text
    assert text.endswith(
        "; result of call_9 (error): 'failed'; image (image/png, 2 bytes); raw block of anthropic"
    )
    assert describe_message(Message("user", ())) == "user: (empty)"
