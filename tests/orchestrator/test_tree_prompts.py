"""Each distinct prompt is stored once per State tree: subagents name the State that holds it.

The first State of a tree to use a prompt records it in full; a child of the same agent (a
parallel sibling, a later one) or an agent its ancestor already told the same thing names that
State in its requests (`ModelRequest.prompt_holder`) instead of storing a copy.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator import (
    Agent,
    HistoryEntry,
    Message,
    ModelRequest,
    ModelRequestEntry,
    Prompt,
    PromptEntry,
    State,
    tool,
)
from orchestrator._cli import cli
from orchestrator._viewing._views import prompt_holders, state_data
from orchestrator.testing import FakeModel, ReplayMismatch, ReplayModel, tool_call
from stores import FileStore, MemoryStore, SQLiteStore

AnyStore = MemoryStore | FileStore | SQLiteStore

pytestmark = pytest.mark.anyio

QUESTION = "Compare three databases."


@tool
def look(topic: str) -> str:
    """Look a topic up."""
    return f"notes on {topic}"


def team(
    researcher_says: str = "Research one topic.",
    *,
    parallel: int = 3,
    store: AnyStore | None = None,
) -> tuple[Agent, Agent]:
    """A lead that starts `parallel` researchers at once, then one more, then answers."""
    researcher = Agent(
        FakeModel(["found"] * (parallel + 1)),
        tools=[look],
        name="researcher",
        description="Researches one topic.",
        instructions=researcher_says,
    )
    fan_out = [tool_call("researcher", task=f"topic {n}") for n in range(parallel)]
    lead = Agent(
        FakeModel([fan_out, tool_call("researcher", task="one more"), "done"]),
        tools=[researcher],
        name="lead",
        instructions="Split the question.",
        store=store,
    )
    return lead, researcher


def requests(state: State) -> list[ModelRequestEntry]:
    return [entry for entry in state.history if isinstance(entry, ModelRequestEntry)]


def prompts(state: State) -> list[Prompt]:
    return [entry.content for entry in state.history if isinstance(entry, PromptEntry)]


def children(state: State) -> list[State]:
    ids = [i for entry in state.history if entry.kind == "tool_result" for i in entry.child_ids]
    return [state.child(child_id) for child_id in ids]


async def test_a_tree_stores_each_prompt_once_and_children_name_its_holder(
    tmp_path: Path,
) -> None:
    with SQLiteStore(tmp_path / "runs.db") as store:  # its async methods: asyncio and trio
        lead, _ = team(store=store)
        root = State(messages=[Message.user(QUESTION)])
        await lead.arun(root)
        loaded = await store.aload(root.id)
        kids = [await loaded.achild(child_id) for child_id in loaded.children]
    assert len(kids) == 4
    # One full copy of the researchers' prompt in the whole tree; every other child names it.
    holders = [kid for kid in kids if prompts(kid)]
    assert len(holders) == 1
    (holder,) = holders
    (prompt,) = prompts(holder)
    assert prompt.instructions == "Research one topic."
    assert prompt.tool_names == ("look",)
    for kid in kids:
        (request,) = requests(kid)
        assert request.content.prompt == prompt.digest
        if kid is holder:
            assert request.content.prompt_holder is None
            assert kid.prompt_of(request) == prompt
        else:
            assert request.content.prompt_holder == holder.id
            assert kid.prompt_of(request) is None  # not in its own history: ask its holder
            assert holder.prompt_of(request) == prompt
    assert len(prompts(loaded)) == 1  # the lead's own prompt, not the researchers'


def test_a_child_told_what_its_ancestor_was_told_names_the_ancestor() -> None:
    # The lead and its helper get the same instructions and tool specs: one prompt, one copy.
    leaf = Agent(FakeModel(["leaf"]), name="helper", description="Helps.", instructions="Help.")
    helper = Agent(
        FakeModel(["helped"]),
        tools=[leaf],
        name="helper",
        description="Helps.",
        instructions="Help.",
    )
    lead = Agent(
        FakeModel([tool_call("helper", task="x"), "done"]), tools=[helper], instructions="Help."
    )
    root = State(messages=[Message.user("go")])
    lead.run(root)
    (kid,) = children(root)
    (prompt,) = prompts(root)
    assert prompts(kid) == []
    (request,) = requests(kid)
    assert (request.content.prompt, request.content.prompt_holder) == (prompt.digest, root.id)
    assert root.prompt_of(request) == prompt


def test_show_json_and_replay_resolve_a_childs_prompt(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    root = State(messages=[Message.user(QUESTION)])
    with SQLiteStore(path) as store:
        lead, _ = team(store=store)
        lead.run(root)
        kids = [store.load(child_id) for child_id in store.load(root.id).children]
        named = next(kid for kid in kids if not prompts(kid))
        data = state_data(named, holders=prompt_holders(named, store.load))
        assert state_data(named)["model_calls"][0]["prompt"] is None  # without its holder
    (call,) = data["model_calls"]
    assert call["prompt"]["instructions"] == "Research one topic."
    assert [spec["name"] for spec in call["prompt"]["tools"]] == ["look"]
    shown = CliRunner().invoke(cli, ["show", str(path), named.id, "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["model_calls"][0]["prompt"] == call["prompt"]

    # Replay compares the children's prompts too: another researcher instruction differs.
    with SQLiteStore(path) as store:
        same = ReplayModel.load(store, root.id)
        changed = ReplayModel.load(store, root.id)
    again, _ = team_on(same)
    again.run(State(messages=[Message.user(QUESTION)]))
    same.check()
    other, _ = team_on(changed, researcher_says="Research two topics.")
    with pytest.raises(ReplayMismatch, match="instructions differ"):
        other.run(State(messages=[Message.user(QUESTION)]))


def team_on(
    model: ReplayModel, researcher_says: str = "Research one topic."
) -> tuple[Agent, Agent]:
    researcher = Agent(
        model,
        tools=[look],
        name="researcher",
        description="Researches one topic.",
        instructions=researcher_says,
    )
    lead = Agent(model, tools=[researcher], name="lead", instructions="Split the question.")
    return lead, researcher


def test_a_request_naming_a_holder_must_name_a_digest() -> None:
    lead, _ = team(parallel=1)
    root = State(messages=[Message.user(QUESTION)])
    lead.run(root)
    (kid, later) = children(root)
    (request,) = requests(later)
    assert request.content.prompt_holder == kid.id
    history: list[HistoryEntry] = list(later.history)
    index = history.index(request)
    content = ModelRequest(model="fake", message_count=1, prompt_holder=kid.id)
    history[index] = dataclasses.replace(request, content=content)
    with pytest.raises(ValueError, match=f"naming State '{kid.id}' but no prompt digest"):
        State(history=history)
    # A digest this history does not hold, with no holder named, is still damage.
    content = ModelRequest(model="fake", message_count=1, prompt=request.content.prompt)
    history[index] = dataclasses.replace(request, content=content)
    with pytest.raises(ValueError, match="which is not recorded"):
        State(history=history)


def test_a_child_with_its_own_copy_loads_as_before(sync_store: AnyStore) -> None:
    # Today's stores hold a full copy per State: such a child loads and tells its prompt.
    lead, _ = team(parallel=1)
    root = State(messages=[Message.user(QUESTION)])
    lead.run(root)
    holder, later = children(root)
    (told,) = [entry for entry in holder.history if isinstance(entry, PromptEntry)]
    old: list[HistoryEntry] = []
    for entry in later.history:
        if isinstance(entry, ModelRequestEntry):
            old.append(dataclasses.replace(told, seq=len(old)))
            content = dataclasses.replace(entry.content, prompt_holder=None)
            entry = dataclasses.replace(entry, content=content)
        old.append(dataclasses.replace(entry, seq=len(old)))
    copy = State(history=old)
    sync_store.save(copy)
    loaded = sync_store.load(copy.id)
    assert loaded.prompt_of(requests(loaded)[0]) == told.content
    assert loaded.messages == later.messages
