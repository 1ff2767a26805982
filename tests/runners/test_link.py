"""The public link (``agent.arun(state, link=...)``) and how a subagent tool picks its runner."""

from __future__ import annotations

import pytest

from orchestrator import Agent, Link, Memory, Message, State, ToolResultEntry, tool
from orchestrator.runners import ChildJob, LocalRunner, Runner
from orchestrator.testing import FakeModel, tool_call
from stores import MemoryStore

pytestmark = pytest.mark.anyio


def first_result(state: State) -> ToolResultEntry:
    return next(e for e in state.history if isinstance(e, ToolResultEntry))


async def test_a_link_makes_a_state_the_child_of_a_call_in_another_process() -> None:
    store = MemoryStore()
    agent = Agent(FakeModel(["hi"]), name="kid", store=store)
    state = State(messages=[Message.user("go")])
    link = Link(parent_id="lead1", call_id="call_7", scope="lead1:1:call_7/0")
    assert await agent.arun(state, link=link) == "hi"
    assert (state.parent_id, state.parent_call_id) == ("lead1", "call_7")
    assert store.load(state.id).parent_id == "lead1"


async def test_memory_effect_keys_start_with_the_links_scope() -> None:
    keys: list[str | None] = []

    class Keys(MemoryStore):
        def memory_put(
            self, agent: str, space: str, key: str, data: str | None, *, effect: str | None = None
        ) -> bool:
            keys.append(effect)
            return super().memory_put(agent, space, key, data, effect=effect)

    store = Keys()

    @tool
    def remember(memory: Memory) -> str:
        """Remember a fact."""
        memory.set("fact", 1)
        return "ok"

    agent = Agent(
        FakeModel([tool_call("remember"), "done"]), name="kid", store=store, tools=[remember]
    )
    link = Link(parent_id="lead1", call_id="call_7", scope="lead1:1:call_7/0")
    await agent.arun(State(messages=[Message.user("go")]), link=link)
    assert len(keys) == 1
    assert keys[0] is not None
    assert keys[0].startswith("lead1:1:call_7/0:1:")


async def test_a_child_of_another_call_cannot_run_under_a_new_link() -> None:
    agent = Agent(FakeModel(["a", "b"]), name="kid")
    state = State(messages=[Message.user("go")])
    await agent.arun(state, link=Link(parent_id="p", call_id="c1", scope="p:1:c1/0"))
    state.add_message(Message.user("more"))
    with pytest.raises(ValueError, match="is the child of call 'c1'"):
        await agent.arun(state, link=Link(parent_id="p", call_id="c2", scope="p:1:c2/0"))
    # The same link again is fine (a child continued).
    assert await agent.arun(state, link=Link(parent_id="p", call_id="c1", scope="x")) == "b"


def test_a_link_refuses_empty_parts_and_arun_a_non_link() -> None:
    with pytest.raises(ValueError, match=r"Link\.call_id must be a non-empty str"):
        Link(parent_id="p", call_id="", scope="s")
    agent = Agent(FakeModel(["a"]))
    with pytest.raises(TypeError, match="link must be a Link"):
        agent.run("go", link="p/c")  # type: ignore[arg-type]


class Recording(LocalRunner):
    """A LocalRunner that keeps the jobs it ran."""

    def __init__(self) -> None:
        self.jobs: list[ChildJob] = []

    async def run(self, job: ChildJob) -> State:
        self.jobs.append(job)
        return await super().run(job)


async def test_the_parents_runner_runs_its_subagents_children_linked_to_the_call() -> None:
    runner = Recording()
    assert isinstance(runner, Runner)
    store = MemoryStore()
    kid = Agent(FakeModel(["found"]), name="kid", description="Finds")
    lead = Agent(
        FakeModel([tool_call("kid", task="find it"), "done"]),
        tools=[kid],
        store=store,
        runner=runner,
    )
    assert lead.runner is runner
    state = State(messages=[Message.user("go")])
    await lead.arun(state)
    (job,) = runner.jobs
    result = first_result(state)
    assert (job.task, job.agent, job.store) == ("find it", kid, store)
    assert job.link == Link(
        parent_id=state.id, call_id=result.call.id, scope=f"{state.id}:1:{result.call.id}/0"
    )
    assert result.child_ids == (job.state_id,)
    child = state.child(job.state_id)
    assert child.parent_call_id == result.call.id
    assert state.usage.requests == 3


async def test_a_tools_own_runner_wins_over_the_agents() -> None:
    agents_runner, tools_runner = Recording(), Recording()
    kid = Agent(FakeModel(["found"]), name="kid", description="Finds")
    lead = Agent(
        FakeModel([tool_call("kid", task="t"), "done"]),
        tools=[kid.as_tool(runner=tools_runner)],
        runner=agents_runner,
    )
    await lead.arun("go")
    assert (len(agents_runner.jobs), len(tools_runner.jobs)) == (0, 1)


async def test_a_runner_that_refuses_a_job_ends_the_run_before_the_child_starts() -> None:
    class Refuses(LocalRunner):
        def check(self, job: ChildJob) -> None:
            raise ValueError(f"no place for {job.agent.name}")

    kid_model = FakeModel(["found"])
    kid = Agent(kid_model, name="kid", description="Finds")
    lead = Agent(FakeModel([tool_call("kid", task="t"), "done"]), tools=[kid], runner=Refuses())
    state = State(messages=[Message.user("go")])
    with pytest.raises(ValueError, match="no place for kid"):
        await lead.arun(state)
    assert kid_model.requests == []
    assert first_result(state).outcome == "aborted"


def test_runner_must_be_a_runner() -> None:
    with pytest.raises(TypeError, match="runner must be a Runner"):
        Agent(FakeModel([]), runner="ray")  # type: ignore[arg-type]
    kid = Agent(FakeModel([]), name="kid", description="Finds")
    with pytest.raises(TypeError, match="resume must be True or False"):
        kid.as_tool(resume="yes")  # type: ignore[arg-type]
