"""What the model was told: each distinct prompt recorded once per State, named by its requests.

The prompt (instructions, tool specs, options) is a history entry, content-addressed by digest;
it is folded, stored, chained and checked like every entry, and old histories without it load.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import pytest

from orchestrator import (
    Agent,
    HistoryEntry,
    Message,
    ModelRequest,
    ModelRequestEntry,
    Prompt,
    PromptEntry,
    State,
    StoreDamagedError,
    prompt_difference,
    tool,
)
from orchestrator.models import AnthropicModel, ModelWithOptions, OpenAIModel
from orchestrator.testing import FakeModel, tool_call
from stores import SQLiteStore
from tests.doubles import add, assert_replays, reseal_sql


@tool
def shout(text: str) -> str:
    """Say it loud."""
    return text.upper()


def asked(text: str = "What is 1 + 2?") -> State:
    return State(messages=[Message.user(text)])


def requests(state: State) -> list[ModelRequestEntry]:
    return [entry for entry in state.history if isinstance(entry, ModelRequestEntry)]


def prompts(state: State) -> list[Prompt]:
    return [entry.content for entry in state.history if isinstance(entry, PromptEntry)]


def two_turns(instructions: str = "Be brief.") -> Agent:
    return Agent(
        FakeModel([tool_call("add", a=1, b=2), "3"]), tools=[add], instructions=instructions
    )


def test_a_run_records_its_prompt_once_before_the_first_request() -> None:
    state = asked()
    two_turns().run(state)
    kinds = [entry.kind for entry in state.history]
    assert kinds.index("prompt") == kinds.index("model_request") - 1
    assert kinds.count("prompt") == 1
    (prompt,) = prompts(state)
    assert prompt.instructions == "Be brief."
    assert prompt.tool_names == ("add",)
    assert prompt.tools[0]["input_schema"]["required"] == ["a", "b"]
    assert prompt.options == {}
    first, second = requests(state)
    assert first.content.prompt == second.content.prompt == prompt.digest
    assert state.prompt_of(first) is prompt
    assert_replays(state)


def test_the_same_prompt_is_not_recorded_again_by_a_later_run() -> None:
    state = asked()
    two_turns().run(state)
    state.add_message(Message.user("And 2 + 2?"))
    two_turns().run(state)
    assert len(prompts(state)) == 1
    assert len({entry.content.prompt for entry in requests(state)}) == 1


def test_a_changed_prompt_is_recorded_and_named_by_the_requests_after_it() -> None:
    state = asked()
    two_turns("Be brief.").run(state)
    state.add_message(Message.user("And 2 + 2?"))
    two_turns("Answer in French.").run(state)
    first, second = prompts(state)
    assert [state.prompt_of(entry) for entry in requests(state)] == [first, first, second, second]
    difference = prompt_difference(first, second)
    assert difference is not None
    assert "-Be brief." in difference
    assert "+Answer in French." in difference


def test_the_digest_is_of_the_content_and_checked() -> None:
    prompt = Prompt.of("Be brief.", [shout.spec], {"temperature": 0})
    again = Prompt.of("Be brief.", [shout.spec], {"temperature": 0})
    assert prompt == again
    assert len(prompt.digest) == 16
    assert Prompt.of("Be brief!", [shout.spec], {"temperature": 0}).digest != prompt.digest
    assert Prompt.of("Be brief.", [shout.spec], {"temperature": 1}).digest != prompt.digest
    with pytest.raises(ValueError, match="not the digest of its instructions"):
        Prompt(instructions="Be nice.", tools=prompt.tools, digest=prompt.digest)
    with pytest.raises(TypeError, match="options"):
        Prompt.of("x", [], {"when": object()})


def test_a_request_naming_an_unrecorded_prompt_cannot_follow() -> None:
    state = asked()
    two_turns().run(state)
    prompt_at = next(i for i, entry in enumerate(state.history) if entry.kind == "prompt")
    request = state.history[prompt_at + 1]
    assert isinstance(request, ModelRequestEntry)
    forged = ModelRequestEntry(
        seq=prompt_at,
        turn=request.turn,
        at=request.at,
        content=ModelRequest(model="fake", message_count=1, prompt="0123456789abcdef"),
    )
    with pytest.raises(ValueError, match="prompt '0123456789abcdef', which is not recorded"):
        State(history=[*state.history[:prompt_at], forged])


def test_an_old_history_without_prompts_loads_and_says_not_recorded() -> None:
    state = asked()
    two_turns().run(state)
    old: list[HistoryEntry] = []
    for entry in state.history:
        if isinstance(entry, PromptEntry):
            continue
        entry = dataclasses.replace(entry, seq=len(old))
        if isinstance(entry, ModelRequestEntry):
            content = ModelRequest(model=entry.content.model, message_count=1)
            entry = dataclasses.replace(entry, content=content)
        old.append(entry)
    loaded = State(history=old)
    assert loaded.messages == state.messages
    assert [loaded.prompt_of(entry) for entry in requests(loaded)] == [None, None]


def test_prompt_of_takes_a_request_entry() -> None:
    state = asked()
    two_turns().run(state)
    reply = next(entry for entry in state.history if entry.kind == "model_reply")
    with pytest.raises(TypeError, match="model request, ask or compaction entry"):
        state.prompt_of(reply)  # type: ignore[arg-type]


def test_a_stored_prompt_loads_and_an_edited_one_is_damage(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    state = asked()
    state_id = state.id
    with SQLiteStore(path) as store:
        two_turns("Never reveal the code 1234.").run(state)
        store.save(state)
        loaded = store.load(state_id)
    assert loaded.history == state.history
    assert [loaded.prompt_of(entry) for entry in requests(loaded)] == prompts(state) * 2
    db = sqlite3.connect(path)
    with db:
        db.execute(
            "UPDATE entries SET data = CAST(replace(CAST(data AS TEXT), '1234', '9999') AS BLOB)"
            " WHERE state_id = ?",
            (state_id,),
        )
    db.close()
    reseal_sql(path, state_id)  # the chain passes: the prompt's own digest does not
    with SQLiteStore(path) as store, pytest.raises(StoreDamagedError, match="cannot be read"):
        store.load(state_id)


def test_a_stored_request_naming_an_unrecorded_prompt_is_damage(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    state = asked()
    with SQLiteStore(path) as store:
        two_turns().run(state)
        store.save(state)
    digest = prompts(state)[0].digest
    db = sqlite3.connect(path)
    with db:
        db.execute(
            "UPDATE entries SET data = CAST(replace(CAST(data AS TEXT), ?, ?) AS BLOB)"
            " WHERE state_id = ? AND instr(CAST(data AS TEXT), 'model_request') > 0",
            (digest, "f" * 16, state.id),
        )
    db.close()
    reseal_sql(path, state.id)
    with SQLiteStore(path) as store, pytest.raises(StoreDamagedError, match="not recorded"):
        store.load(state.id)


def test_provider_models_tell_their_options() -> None:
    openai = OpenAIModel("gpt-4o", api_key="k", temperature=0.2, max_tokens=300, params={"seed": 1})
    assert isinstance(openai, ModelWithOptions)
    assert openai.options == {"max_completion_tokens": 300, "temperature": 0.2, "seed": 1}
    claude = AnthropicModel("claude-sonnet-4-5", api_key="k", thinking_budget=2048, cache=False)
    assert claude.options["max_tokens"] == 8192  # the default the API requires
    assert claude.options["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert claude.options["cache"] is False
    assert not isinstance(FakeModel(["hi"]), ModelWithOptions)


class TunedModel(FakeModel):
    """A fake model that tells its options, as a provider model does."""

    @property
    def options(self) -> dict[str, object]:
        return {"temperature": 0.5}


def test_an_agent_records_its_models_options() -> None:
    state = asked()
    Agent(TunedModel(["3"]), instructions="Be brief.").run(state)
    (prompt,) = prompts(state)
    assert prompt.options == {"temperature": 0.5}
    assert prompt == Prompt.of("Be brief.", [], {"temperature": 0.5})


def test_prompt_difference_names_the_tool_and_the_options() -> None:
    before = Prompt.of("x", [shout.spec, add.spec], {"temperature": 0})
    assert prompt_difference(before, before) is None
    assert prompt_difference(None, before) is None
    renamed = Prompt.of("x", [shout.spec], {"temperature": 0})
    assert prompt_difference(before, renamed) == "the tools differ: removed ['add'], added []"
    warmer = Prompt.of("x", [shout.spec, add.spec], {"temperature": 1})
    difference = prompt_difference(before, warmer)
    assert difference is not None
    assert difference.startswith("the options differ:")
    assert '- "temperature": 0' in difference
    assert '+ "temperature": 1' in difference
