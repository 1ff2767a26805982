"""`ask` and `compact` record what their requests told the model, as a turn's request does.

Their requests carry the agent's instructions and its model's options but no tools; the
`ask` entry, or the compaction, names that prompt by digest (recorded once per State).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TypeVar

import pytest

from orchestrator import (
    Agent,
    AskEntry,
    ContextChangeEntry,
    Message,
    ModelRequestEntry,
    OutputError,
    Prompt,
    PromptEntry,
    State,
    loop,
)
from orchestrator.models import Request
from orchestrator.testing import FakeModel, ReplayModel, tool_call
from stores import SQLiteStore, decode_entry, encode_entry
from tests.doubles import add, assert_replays

pytestmark = pytest.mark.anyio

OPTIONS = {"temperature": 0.5}

_E = TypeVar("_E")


class TunedModel(FakeModel):
    """A fake model that tells its options, as a provider model does."""

    @property
    def options(self) -> dict[str, object]:
        return dict(OPTIONS)


def asked() -> State:
    return State(messages=[Message.user("What is 1 + 2?")])


def prompts(state: State) -> list[Prompt]:
    return [entry.content for entry in state.history if isinstance(entry, PromptEntry)]


def told(request: Request) -> Prompt:
    """The prompt a request carried: what its entry must name."""
    return Prompt.of(request.system, request.tools, OPTIONS)


def only(state: State, kind: type[_E]) -> _E:
    (entry,) = [entry for entry in state.history if isinstance(entry, kind)]
    return entry


async def test_an_ask_names_the_prompt_its_request_sent() -> None:
    model = TunedModel([tool_call("add", a=1, b=2), "3", "It is sums."])
    agent = Agent(model, tools=[add], instructions="Be brief.")
    state = asked()
    await agent.arun(state)
    assert await agent.aask(state, "What is this about?") == "It is sums."
    entry = only(state, AskEntry)
    prompt = state.prompt_of(entry)
    assert prompt is not None
    # What the ask's request sent: the instructions and options, and no tools.
    assert prompt == told(model.requests[-1])
    assert (prompt.instructions, prompt.tool_names, prompt.options) == ("Be brief.", (), OPTIONS)
    assert entry.content.prompt == prompt.digest
    assert entry.content.prompt_holder is None
    # The turn's prompt (with the tool) and the ask's are two entries, each before its user.
    turn_prompt, ask_prompt = prompts(state)
    assert ask_prompt is prompt
    assert turn_prompt.tool_names == ("add",)
    kinds = [item.kind for item in state.history]
    assert kinds[-2:] == ["prompt", "ask"]
    assert_replays(state)


async def test_asks_and_turns_with_the_same_prompt_record_it_once() -> None:
    model = TunedModel(["first", '{"n": 3}', "again"])
    agent = Agent(model, instructions="Be brief.")  # no tools: a turn sends what an ask sends
    state = asked()
    await agent.arun(state)
    await agent.aask(state, "How many?", dict[str, int])
    await agent.aask(state, "Say it again.")
    (prompt,) = prompts(state)
    requests = [entry for entry in state.history if isinstance(entry, ModelRequestEntry)]
    asks = [entry for entry in state.history if isinstance(entry, AskEntry)]
    assert len(asks) == 2
    for entry in [*requests, *asks]:
        assert entry.content.prompt == prompt.digest
        assert state.prompt_of(entry) is prompt


async def test_a_failed_ask_names_its_prompt_too() -> None:
    agent = Agent(TunedModel(["not json", "still not"]), instructions="Count.")
    state = asked()
    with pytest.raises(OutputError):
        await agent.aask(state, "How many?", int, retries=1)
    entry = only(state, AskEntry)
    assert entry.content.error is not None
    prompt = state.prompt_of(entry)
    assert prompt is not None
    assert prompt.instructions == "Count."


async def test_a_compaction_names_the_prompt_its_request_sent() -> None:
    model = TunedModel([tool_call("add", a=1, b=2), "3", "We added 1 and 2: 3."])
    agent = Agent(model, tools=[add], instructions="Be brief.")
    state = asked()
    await agent.arun(state)
    await agent.acompact(state)
    (compaction,) = [
        entry
        for entry in state.history
        if isinstance(entry, ContextChangeEntry) and entry.content.kind == "compact"
    ]
    prompt = state.prompt_of(compaction)
    assert prompt is not None
    assert prompt == told(model.requests[-1])
    assert prompt.tool_names == ()
    assert compaction.content.summary == "We added 1 and 2: 3."
    assert_replays(state)


async def test_a_compaction_the_caller_wrote_names_no_prompt() -> None:
    state = asked()
    state.compact("The user asks a sum.")
    change = state.history[-1]
    assert isinstance(change, ContextChangeEntry)
    assert change.content.kind == "compact"
    assert change.content.prompt is None
    assert state.prompt_of(change) is None


async def test_an_empty_summary_records_what_it_spent_with_its_prompt() -> None:
    agent = Agent(TunedModel(["3", "  "]), instructions="Be brief.")
    state = asked()
    await agent.arun(state)
    with pytest.raises(OutputError, match="empty summary"):
        await agent.acompact(state)
    entry = only(state, AskEntry)
    prompt = state.prompt_of(entry)
    assert prompt is not None
    assert prompt.instructions == "Be brief."


async def test_an_ask_in_a_loop_body_names_the_saved_prompt_of_its_tree(tmp_path: Path) -> None:
    @loop(limit=1)
    async def think_then_ask(agent: Agent, state: State) -> None:
        await agent.athink(state)
        await agent.aask(state, "Anything left?")

    with SQLiteStore(tmp_path / "runs.db") as store:
        agent = Agent(
            TunedModel(["3", "nothing"]),
            instructions="Be brief.",
            loop=think_then_ask,
            store=store,
        )
        state = asked()
        await agent.arun(state)
        loaded = await store.aload(state.id)
    # The ask sent what the turn did (no tools): its own State holds the prompt already.
    (prompt,) = prompts(loaded)
    entry = only(loaded, AskEntry)
    assert entry.content.prompt == prompt.digest
    assert entry.content.prompt_holder is None
    assert loaded.prompt_of(entry) == prompt


async def test_ask_and_compaction_prompts_survive_a_store(tmp_path: Path) -> None:
    model = TunedModel([tool_call("add", a=1, b=2), "3", "It is sums.", "Added 1 and 2."])
    agent = Agent(model, tools=[add], instructions="Be brief.")
    state = asked()
    with SQLiteStore(tmp_path / "runs.db") as store:
        await agent.arun(state)
        await agent.aask(state, "What is this about?")
        await agent.acompact(state)
        await store.asave(state)
        loaded = await store.aload(state.id)
    assert loaded.history == state.history
    ask = only(loaded, AskEntry)
    compaction = [item for item in loaded.history if isinstance(item, ContextChangeEntry)][-1]
    assert loaded.prompt_of(ask) == state.prompt_of(only(state, AskEntry)) is not None
    assert loaded.prompt_of(compaction) == loaded.prompt_of(ask)


async def test_a_history_with_an_ask_replays() -> None:
    agent = Agent(
        TunedModel(["It is a sum.", tool_call("add", a=1, b=2), "3"]),
        tools=[add],
        instructions="Be brief.",
    )
    state = asked()
    await agent.aask(state, "What kind of question is it?")
    await agent.arun(state)
    assert [item.kind for item in state.history].count("prompt") == 2
    replay = ReplayModel(state, options=OPTIONS)
    again = asked()
    await Agent(replay, tools=[add], instructions="Be brief.").arun(again)
    replay.check()
    assert again.answer == "3"
    assert replay.answered == 2


async def test_an_ask_naming_an_unrecorded_prompt_cannot_follow() -> None:
    agent = Agent(TunedModel(["It is a sum."]), instructions="Be brief.")
    state = asked()
    await agent.aask(state, "What kind of question is it?")
    *before, prompt_entry, ask = state.history
    assert isinstance(prompt_entry, PromptEntry)
    assert isinstance(ask, AskEntry)
    forged = dataclasses.replace(ask, seq=ask.seq - 1)
    with pytest.raises(ValueError, match=r"an ask naming the prompt .*, which is not recorded"):
        State(history=[*before, forged])


async def test_an_ask_stored_before_asks_named_prompts_loads() -> None:
    agent = Agent(TunedModel(["It is a sum."]), instructions="Be brief.")
    state = asked()
    await agent.aask(state, "What kind of question is it?")
    *before, _, ask = state.history
    assert isinstance(ask, AskEntry)
    old = json.loads(encode_entry(ask))
    del old["content"]["prompt"], old["content"]["prompt_holder"]
    old["seq"] = ask.seq - 1
    entry = decode_entry(json.dumps(old), state_id=state.id, index=ask.seq - 1)
    assert isinstance(entry, AskEntry)
    loaded = State(history=[*before, entry])
    assert loaded.prompt_of(entry) is None
    assert loaded.usage == state.usage


async def test_a_subagents_ask_names_the_state_of_its_tree_that_holds_the_prompt(
    tmp_path: Path,
) -> None:
    @loop(limit=1)
    async def think_then_ask(agent: Agent, state: State) -> None:
        await agent.athink(state)
        await agent.aask(state, "Anything left?")

    def helper_replies(request: Request) -> str:
        return "no" if request.messages[-1].text == "Anything left?" else "found"

    helper = Agent(
        TunedModel([helper_replies] * 4),
        instructions="Help.",  # no tools: its turns and asks send one prompt
        name="helper",
        description="Helps with one task.",
        loop=think_then_ask,
    )
    with SQLiteStore(tmp_path / "runs.db") as store:
        lead = Agent(
            FakeModel([tool_call("helper", task="one"), tool_call("helper", task="two"), "done"]),
            tools=[helper],
            store=store,
        )
        root = asked()
        await lead.arun(root)
        loaded = await store.aload(root.id)
        first, second = [await loaded.achild(child_id) for child_id in loaded.children]
    (prompt,) = prompts(first)
    assert prompt.instructions == "Help."
    assert prompts(second) == []  # the tree stores it once: the first helper holds it
    ask = only(second, AskEntry)
    assert ask.content.prompt == prompt.digest
    assert ask.content.prompt_holder == first.id
    assert second.prompt_of(ask) is None  # held by the first helper: ask that one
    assert first.prompt_of(ask) == prompt
    assert only(first, AskEntry).content.prompt_holder is None
