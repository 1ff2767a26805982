"""Subagents end to end (issue #5, DESIGN section 8, seed 004), on asyncio and on trio.

A tool call links every new State an agent runs while the call executes: through `as_tool`, an
Agent in `tools=`, an async tool, or a sync tool in a worker thread. The child records the link
in its first `run_start`, the call's `tool_result` lists the children in start order and adds
their usage (grandchildren included). Concurrency is proven with counters and events that only
open once every participant has arrived (a sequential run would wait forever, so `fail_after`
turns a regression into a failure); no assertion depends on timing.

The store-dependent cases are in `test_subagents_stores.py`.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Literal

import anyio
import pytest

from orchestrator import (
    Agent,
    Message,
    Reply,
    Reporter,
    RunStartEntry,
    State,
    StoppedByLimit,
    StoppedByUntil,
    Tool,
    ToolCall,
    ToolResultEntry,
    Usage,
    loop,
    tool,
    waiting_for_user,
)
from orchestrator.models import Request
from orchestrator.testing import FakeModel, tool_call
from tests.doubles import (
    assert_consistent,
    child_ids,
    errors,
    lookup,
    only_child,
    result_of,
    results,
)

How = Literal["as_tool", "agent_in_tools", "async_tool", "sync_tool"]
HOWS: tuple[How, ...] = ("as_tool", "agent_in_tools", "async_tool", "sync_tool")
TIMEOUT = 20  # seconds; only reached when a regression makes something wait forever

# Helpers --------------------------------------------------------------------------------------


def run_starts(state: State) -> list[RunStartEntry]:
    return [entry for entry in state.history if isinstance(entry, RunStartEntry)]


def user_state(text: str = "Go", state_id: str | None = None) -> State:
    return State(id=state_id, messages=[Message.user(text)])


def calls(*items: ToolCall, usage: Usage | None = None) -> Reply:
    return Reply(Message.assistant(tool_calls=items), usage or Usage(requests=1))


def text(value: str, usage: Usage | None = None) -> Reply:
    return Reply(Message.assistant(value), usage or Usage(requests=1))


def has_results(request: Request) -> bool:
    """Whether the model is being shown tool results (the turn after its calls)."""
    return bool(request.messages[-1].tool_results)


def first_text(request: Request) -> str:
    return request.messages[0].text


def delegating(how: How, agent: Agent) -> Tool | Agent:
    """A tool named ``delegate`` that runs `agent` on a new State with the task."""
    if how == "as_tool":
        return agent.as_tool("delegate", "Hands a task to a helper.")
    if how == "agent_in_tools":
        return agent.copy(name="delegate", description="Hands a task to a helper.")
    if how == "async_tool":

        @tool(name="delegate")
        async def delegate_async(task: str) -> str:
            """Hand a task to a helper."""
            return str(await agent.arun(State(messages=[Message.user(task)])))

        return delegate_async

    @tool(name="delegate")
    def delegate_sync(task: str) -> str:
        """Hand a task to a helper."""
        assert threading.current_thread() is not threading.main_thread()
        return str(agent.run(task))  # a str starts a new State

    return delegate_sync


class Tree(Reporter):
    """Records the events of a run and every State the run started, by id."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.links: list[tuple[str, str, str]] = []  # (parent id, call id, child id)
        self.states: dict[str, State] = {}
        self.problems: list[str] = []

    def on_run_start(self, state: State) -> None:
        self.events.append(("run_start", state.id))
        self.states[state.id] = state

    def on_think_end(self, state: State, reply: Reply) -> None:
        self.events.append(("think_end", state.id))

    def on_tool_start(self, state: State, call: ToolCall) -> None:
        self.events.append(("tool_start", state.id))

    def on_tool_end(self, state: State, call: ToolCall, entry: ToolResultEntry) -> None:
        self.events.append(("tool_end", state.id))

    def on_child_start(self, parent: State, call: ToolCall, child: State) -> None:
        self.events.append(("child_start", child.id))
        self.links.append((parent.id, call.id, child.id))
        self.states[child.id] = child
        # The link is recorded before the hook runs.
        if (child.parent_id, child.parent_call_id) != (parent.id, call.id):
            self.problems.append(f"{child.id} not linked yet at on_child_start")
        if call not in parent.pending_calls:
            self.problems.append(f"{call.id} is not pending at on_child_start")

    def on_run_end(self, state: State, error: BaseException | None) -> None:
        self.events.append(("run_end", state.id))


# Three levels: lead -> mid -> leaf, with explicit usages ---------------------------------------

LEAD_USAGE = Usage(input_tokens=100, output_tokens=200, requests=1, cost=0.5)
MID_USAGE = Usage(input_tokens=10, output_tokens=20, requests=1, cost=0.25)
LEAF_USAGE = Usage(input_tokens=1, output_tokens=2, requests=1, cost=0.125)


def three_levels(
    lookup_tool: Tool = lookup,
    *,
    leaf_model: FakeModel | None = None,
    reporter: Reporter | None = None,
) -> Agent:
    """A lead agent whose `mid` subagent has a `leaf` subagent with the tool `lookup_tool`."""
    leaf_model = leaf_model or FakeModel(
        [calls(tool_call(lookup_tool.name), usage=LEAF_USAGE), text("line 12", LEAF_USAGE)]
    )
    leaf = Agent(
        leaf_model, tools=[lookup_tool], name="leaf", description="Looks things up in the code."
    )

    def relay(request: Request) -> Reply:
        return text(f"leaf said: {request.messages[-1].tool_results[0].text}", MID_USAGE)

    mid_model = FakeModel([calls(tool_call("leaf", task="find the line"), usage=MID_USAGE), relay])
    mid = Agent(mid_model, tools=[leaf], name="mid", description="Investigates a bug.")
    lead_model = FakeModel(
        [
            calls(tool_call("mid", task="investigate the crash"), usage=LEAD_USAGE),
            text("The bug is on line 12.", LEAD_USAGE),
        ]
    )
    return Agent(lead_model, tools=[mid.as_tool()], name="lead", reporter=reporter)


# as_tool and Agent in tools= -------------------------------------------------------------------


def test_as_tool_is_a_tool_with_the_one_argument_task() -> None:
    researcher = Agent(FakeModel([]), name="researcher", description="Finds facts.")
    spec = researcher.as_tool().spec
    assert (spec.name, spec.description) == ("researcher", "Finds facts.")
    assert spec.input_schema["type"] == "object"
    assert list(spec.input_schema["properties"]) == ["task"]
    assert spec.input_schema["properties"]["task"]["type"] == "string"
    assert list(spec.input_schema["required"]) == ["task"]
    assert spec.input_schema["additionalProperties"] is False
    renamed = researcher.as_tool("finder", "Finds facts fast.").spec
    assert (renamed.name, renamed.description) == ("finder", "Finds facts fast.")
    assert renamed.input_schema == spec.input_schema
    by_keyword = researcher.as_tool(description="Other words.").spec
    assert (by_keyword.name, by_keyword.description) == ("researcher", "Other words.")


def test_an_agent_in_tools_becomes_the_same_tool_as_as_tool() -> None:
    researcher = Agent(FakeModel([]), name="researcher", description="Finds facts.")
    lead = Agent(FakeModel([]), tools=[researcher])
    (made,) = lead.tools
    assert made.name == "researcher"
    assert made.spec == researcher.as_tool().spec


@pytest.mark.parametrize(
    ("name", "description"), [(None, "Finds facts."), ("researcher", None), (None, None)]
)
def test_an_agent_tool_needs_a_name_and_a_description(
    name: str | None, description: str | None
) -> None:
    agent = Agent(FakeModel([]), name=name, description=description)
    with pytest.raises(ValueError, match="needs a name and a description"):
        agent.as_tool()
    with pytest.raises(ValueError, match="needs a name and a description"):
        Agent(FakeModel([]), tools=[agent])
    assert agent.as_tool("finder", "Finds facts.").name == "finder"


@pytest.mark.anyio
async def test_as_tool_runs_the_task_on_a_new_child_state() -> None:
    child_model = FakeModel(["Found it in b.py."])
    researcher = Agent(
        child_model, instructions="Be exact.", name="researcher", description="Finds facts."
    )
    call = tool_call("researcher", task="Find the bug")
    state = user_state("Fix the crash")
    lead = Agent(FakeModel([call, "Done."]), tools=[researcher.as_tool()], name="lead")
    assert await lead.arun(state) == "Done."
    (entry,) = results(state)
    assert entry.outcome == "done"
    assert entry.content.text == "Found it in b.py."
    (child_id,) = entry.child_ids
    child = state.child(child_id)
    assert child.id != state.id
    # The child sees only the task, as its first user message.
    assert child_model.requests[0].messages == (Message.user("Find the bug"),)
    assert child_model.requests[0].system == "Be exact."
    assert child.messages[0] == Message.user("Find the bug")
    assert child.answer == "Found it in b.py."
    # The link is recorded in the child's first run_start, with the agent that ran it.
    (start,) = run_starts(child)
    assert (start.parent_id, start.parent_call_id) == (state.id, call.id)
    assert start.content.agent == "researcher"
    assert (child.parent_id, child.parent_call_id) == (state.id, call.id)
    assert (state.parent_id, state.parent_call_id) == (None, None)
    (lead_start,) = run_starts(state)
    assert (lead_start.parent_id, lead_start.parent_call_id) == (None, None)
    assert_consistent(state)
    assert_consistent(child)


@pytest.mark.anyio
async def test_a_finished_child_gives_its_structured_answer_as_json() -> None:
    @tool
    def submit(file: str, line: int, state: State) -> None:
        """Submit the finding."""
        state.finish({"file": file, "line": line, "tags": ["crash", "refund"]})

    finder = Agent(
        FakeModel([tool_call("submit", file="b.py", line=12)]),
        tools=[submit],
        name="finder",
        description="Finds the line.",
    )
    state = user_state()
    lead = Agent(FakeModel([tool_call("finder", task="find it"), "ok"]), tools=[finder])
    await lead.arun(state)
    child = only_child(state)
    assert child.finished
    (entry,) = results(state)
    assert entry.outcome == "done"
    assert json.loads(entry.content.text) == {
        "file": "b.py",
        "line": 12,
        "tags": ["crash", "refund"],
    }


def test_a_sync_run_links_children_through_as_tool() -> None:
    state = user_state()
    assert three_levels().run(state) == "The bug is on line 12."
    mid = only_child(state)
    leaf = only_child(mid)
    assert (leaf.parent_id, mid.parent_id) == (mid.id, state.id)
    assert leaf.answer == "line 12"
    assert mid.answer == "leaf said: line 12"
    assert results(state)[0].content.text == "leaf said: line 12"


# Implicit linking ------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("how", HOWS)
async def test_a_state_run_during_a_call_becomes_its_child(how: How) -> None:
    child_model = FakeModel([text("b.py:12", Usage(requests=1, cost=0.25))])
    helper = Agent(child_model, name="helper", description="Helps.")
    call = tool_call("delegate", task="find the line")
    lead_model = FakeModel(
        [
            calls(call, usage=Usage(requests=1, cost=1.0)),
            text("It is b.py:12.", Usage(requests=1, cost=0.5)),
        ]
    )
    state = user_state()
    assert await Agent(lead_model, tools=[delegating(how, helper)]).arun(state) == "It is b.py:12."
    (entry,) = results(state)
    assert entry.outcome == "done"
    assert entry.content.text == "b.py:12"
    (child_id,) = entry.child_ids
    child = state.child(child_id)
    assert child is state.child(child_id)
    assert (child.parent_id, child.parent_call_id) == (state.id, call.id)
    assert run_starts(child)[0].parent_id == state.id
    assert child_model.requests[0].messages == (Message.user("find the line"),)
    assert entry.usage == child.usage == Usage(requests=1, cost=0.25)
    assert state.usage == Usage(requests=3, cost=1.75)
    assert_consistent(state)
    assert_consistent(child)


@pytest.mark.anyio
async def test_child_ids_list_the_children_of_one_call_in_start_order() -> None:
    helper = Agent(FakeModel(["one", "two", "three"]))

    @tool
    async def one_by_one() -> str:
        """Run three helpers one after the other."""
        for name in ("c3", "c1", "c2"):
            await helper.arun(user_state(name, state_id=name))
        return "ran three"

    state = user_state()
    await Agent(FakeModel([tool_call("one_by_one"), "ok"]), tools=[one_by_one]).arun(state)
    (entry,) = results(state)
    assert entry.child_ids == ("c3", "c1", "c2")
    assert [state.child(c).answer for c in entry.child_ids] == ["one", "two", "three"]


@pytest.mark.anyio
async def test_children_started_in_a_task_group_inside_a_tool_link_to_its_call() -> None:
    def answer(request: Request) -> str:
        return f"done {first_text(request)}"

    helper = Agent(FakeModel([answer] * 5))
    started: list[str] = []
    all_in = anyio.Event()

    class Watch(Reporter):
        def on_child_start(self, parent: State, call: ToolCall, child: State) -> None:
            started.append(child.id)
            if len(started) == 5:
                all_in.set()

    @tool
    async def fan_out(count: int) -> list[str]:
        """Run helpers at once."""
        answers: dict[int, str] = {}

        async def one(index: int) -> None:
            answers[index] = str(await helper.arun(f"task {index}"))

        async with anyio.create_task_group() as group:
            for index in range(count):
                group.start_soon(one, index)
        return [answers[index] for index in range(count)]

    call = tool_call("fan_out", count=5)
    state = user_state()
    lead = Agent(FakeModel([call, "ok"]), tools=[fan_out], reporter=Watch())
    with anyio.fail_after(TIMEOUT):
        await lead.arun(state)
    assert all_in.is_set()
    entry = result_of(state, call)
    assert list(entry.child_ids) == started  # the order their runs started in
    assert json.loads(entry.content.text) == [f"done task {i}" for i in range(5)]
    for child_id in entry.child_ids:
        assert state.child(child_id).parent_call_id == call.id
    assert entry.usage.requests == 5
    assert state.usage.requests == 7


@pytest.mark.anyio
async def test_a_tool_that_runs_no_agent_lists_no_children() -> None:
    @tool
    async def plain() -> str:
        """Do nothing special."""
        return "plain"

    state = user_state()
    await Agent(FakeModel([tool_call("plain"), "ok"]), tools=[plain]).arun(state)
    (entry,) = results(state)
    assert entry.child_ids == ()
    assert entry.usage == Usage()
    assert state.usage == Usage(requests=2)


@pytest.mark.anyio
async def test_a_child_keeps_its_parent_when_it_runs_again_later() -> None:
    helper = Agent(FakeModel(["first", "second"]), name="helper", description="Helps.")
    call = tool_call("helper", task="start")
    state = user_state()
    await Agent(FakeModel([call, "ok"]), tools=[helper]).arun(state)
    child = only_child(state)
    child.add_message(Message.user("go on"))
    assert await helper.arun(child) == "second"  # outside any tool call
    first, again = run_starts(child)
    assert (first.parent_id, first.parent_call_id) == (state.id, call.id)
    assert (again.parent_id, again.parent_call_id) == (None, None)
    assert (child.parent_id, child.parent_call_id) == (state.id, call.id)
    assert State(history=child.history).parent_id == state.id
    assert child_ids(state) == [child.id]


@pytest.mark.anyio
async def test_a_top_level_run_inside_nothing_has_no_parent() -> None:
    state = user_state()
    await Agent(FakeModel(["hi"])).arun(state)
    assert (state.parent_id, state.parent_call_id) == (None, None)
    assert run_starts(state)[0].parent_id is None


# Three levels deep and usage -------------------------------------------------------------------


@pytest.mark.anyio
async def test_three_levels_link_each_state_to_its_parent_call() -> None:
    state = user_state()
    assert await three_levels().arun(state) == "The bug is on line 12."
    (lead_result,) = results(state)
    mid = state.child(lead_result.child_ids[0])
    (mid_result,) = results(mid)
    leaf = mid.child(mid_result.child_ids[0])
    assert (mid.parent_id, mid.parent_call_id) == (state.id, lead_result.call.id)
    assert (leaf.parent_id, leaf.parent_call_id) == (mid.id, mid_result.call.id)
    assert state.child(mid.id).child(leaf.id) is leaf
    assert [start.content.agent for start in (*run_starts(mid), *run_starts(leaf))] == [
        "mid",
        "leaf",
    ]
    # A grandchild is not a child.
    with pytest.raises(KeyError, match="not a child"):
        state.child(leaf.id)
    assert child_ids(leaf) == []
    assert leaf.answer == "line 12"
    assert mid.answer == "leaf said: line 12"
    for each in (state, mid, leaf):
        assert_consistent(each)


@pytest.mark.anyio
async def test_usage_rolls_up_from_grandchildren_when_each_call_closes() -> None:
    state = user_state()
    await three_levels().arun(state)
    mid = only_child(state)
    leaf = only_child(mid)
    assert leaf.usage == Usage(input_tokens=2, output_tokens=4, requests=2, cost=0.25)
    assert mid.usage == Usage(input_tokens=22, output_tokens=44, requests=4, cost=0.75)
    assert state.usage == Usage(input_tokens=222, output_tokens=444, requests=6, cost=1.75)
    # Each tool_result carries what its subtree spent.
    assert results(mid)[0].usage == leaf.usage
    assert results(state)[0].usage == mid.usage
    # It survives a replay: the usage is in the history.
    assert State(history=state.history).usage == state.usage


@pytest.mark.anyio
async def test_children_usage_is_added_when_the_call_closes_not_before() -> None:
    first = Usage(input_tokens=5, requests=1, cost=0.5)
    helper = Agent(FakeModel([text("a", Usage(requests=1, cost=0.25))] * 2))
    seen: list[Usage] = []

    @tool
    async def twice(state: State) -> str:
        """Run two helpers."""
        await helper.arun("one")
        await helper.arun("two")
        seen.append(state.usage)  # the call is still open
        return "ran two"

    call = tool_call("twice")
    state = user_state()
    last = text("ok", Usage(requests=1, cost=0.125))
    await Agent(FakeModel([calls(call, usage=first), last]), tools=[twice]).arun(state)
    assert seen == [first]
    entry = result_of(state, call)
    assert len(entry.child_ids) == 2
    assert entry.usage == Usage(requests=2, cost=0.5)
    assert state.usage == Usage(input_tokens=5, requests=4, cost=1.125)


# Concurrency -----------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("sync_tools", [False, True], ids=["async_tools", "sync_tools"])
async def test_ten_children_of_one_turn_and_their_tools_run_at_once(sync_tools: bool) -> None:
    children, tools_each = 10, 2
    everyone = children * tools_each
    entered = 0
    lock = threading.Lock()
    all_in = anyio.Event()
    all_in_thread = threading.Event()

    @tool(name="wait")
    async def wait_async() -> str:
        """Wait for every other call to arrive."""
        nonlocal entered
        entered += 1
        if entered == everyone:
            all_in.set()
        await all_in.wait()  # a sequential run never gets here for the first call
        return "ok"

    @tool(name="wait")
    def wait_sync() -> str:
        """Wait for every other call to arrive, in a worker thread."""
        nonlocal entered
        with lock:
            entered += 1
            if entered == everyone:
                all_in_thread.set()
        assert all_in_thread.wait(TIMEOUT), "the calls did not run at once"
        return "ok"

    def worker_script(request: Request) -> Any:
        if has_results(request):
            return f"finished {first_text(request)}"
        return [tool_call("wait") for _ in range(tools_each)]

    worker = Agent(
        FakeModel([worker_script] * (children * 2)),
        tools=[wait_sync if sync_tools else wait_async],
        name="worker",
        description="Works on one part.",
    )
    fan_out = [tool_call("worker", task=f"part {i}") for i in range(children)]
    state = user_state()
    lead = Agent(FakeModel([fan_out, "all parts done"]), tools=[worker])
    with anyio.fail_after(TIMEOUT):
        assert await lead.arun(state) == "all parts done"
    assert entered == everyone
    assert [result_of(state, call).content.text for call in fan_out] == [
        f"finished part {i}" for i in range(children)
    ]
    ids = child_ids(state)
    assert len(set(ids)) == children
    for call in fan_out:
        (child_id,) = result_of(state, call).child_ids
        child = state.child(child_id)
        assert child.parent_call_id == call.id
        assert [e.outcome for e in results(child)] == ["done"] * tools_each
        assert_consistent(child)
    assert state.usage.requests == 2 + children * 2
    assert_consistent(state)


@pytest.mark.anyio
@pytest.mark.parametrize("how", HOWS)
async def test_max_concurrency_bounds_the_children_of_one_turn(how: How) -> None:
    # Issue 5: "the children of one turn run concurrently (bounded by the agent's
    # max_concurrency)", however they are started: from sync tools in worker threads too.
    bound, total = 3, 7
    active = peak = 0
    bound_reached = anyio.Event()

    @tool
    async def work() -> str:
        """Work for a while."""
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        if active == bound:
            bound_reached.set()
        await bound_reached.wait()  # the first `bound` children wait for each other
        active -= 1
        return "worked"

    def worker_script(request: Request) -> Any:
        return "done" if has_results(request) else tool_call("work")

    worker = Agent(
        FakeModel([worker_script] * (total * 2)),
        tools=[work],
        name="worker",
        description="Works.",
    )
    fan_out = [tool_call("delegate", task=f"part {i}") for i in range(total)]
    state = user_state()
    lead = Agent(FakeModel([fan_out, "ok"]), tools=[delegating(how, worker)], max_concurrency=bound)
    with anyio.fail_after(TIMEOUT):
        await lead.arun(state)
    assert peak == bound
    assert len(child_ids(state)) == total
    assert [e.outcome for e in results(state)] == ["done"] * total


@pytest.mark.anyio
async def test_the_turn_limit_applies_to_each_child_on_its_own() -> None:
    @loop(until=[waiting_for_user], limit=2)
    async def two_turns(agent: Agent, state: State) -> None:
        await agent.athink(state)
        if state.pending_calls:
            await agent.ause_tools(state)

    @tool
    async def poke() -> str:
        """Poke."""
        return "poked"

    def poke_again(request: Request) -> ToolCall:
        return tool_call("poke")

    worker = Agent(
        FakeModel([poke_again] * 10),
        tools=[poke],
        name="worker",
        description="Never stops on its own.",
        loop=two_turns,
    )
    fan_out = [tool_call("worker", task="a"), tool_call("worker", task="b")]
    state = user_state()
    # The lead has the same limit: its children's turns do not count towards it.
    lead = Agent(FakeModel([fan_out, "both stopped"]), tools=[worker], loop=two_turns)
    with anyio.fail_after(TIMEOUT):
        assert await lead.arun(state) == "both stopped"
    assert state.turn == 2
    assert state.stopped == StoppedByUntil("waiting_for_user")
    for child_id in child_ids(state):
        child = state.child(child_id)
        assert child.turn == 2
        assert child.stopped == StoppedByLimit(2)
        assert len(results(child)) == 2
    assert [e.outcome for e in results(state)] == ["done", "done"]


# Cancellation ----------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("how", HOWS)
async def test_cancelling_the_lead_during_grandchild_tools_closes_every_state(how: How) -> None:
    """The lead reaches each mid-level child `how`; a sync tool's child is cancelled too."""
    entered = 0
    both_in = anyio.Event()

    @tool
    async def dig() -> str:
        """Dig forever."""
        nonlocal entered
        entered += 1
        if entered == 2:
            both_in.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    def leaf_script(request: Request) -> Any:
        return "dug" if has_results(request) else tool_call("dig")

    def mid_script(request: Request) -> Any:
        return "leaf done" if has_results(request) else tool_call("leaf", task="dig there")

    leaf = Agent(FakeModel([leaf_script] * 4), tools=[dig], name="leaf", description="Digs.")
    mid = Agent(FakeModel([mid_script] * 4), tools=[leaf], name="mid", description="Leads.")
    tree = Tree()
    fan_out = [tool_call("delegate", task="north"), tool_call("delegate", task="south")]
    state = user_state()
    lead = Agent(FakeModel([fan_out, "never"]), tools=[delegating(how, mid)], reporter=tree)
    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as group:
            group.start_soon(lead.arun, state)
            await both_in.wait()
            group.cancel_scope.cancel()

    assert tree.problems == []
    mids = [state.child(child_id) for child_id in child_ids(state)]
    leaves = [m.child(child_id) for m in mids for child_id in child_ids(m)]
    assert len(mids) == len(leaves) == 2
    assert set(tree.states) == {s.id for s in (state, *mids, *leaves)}
    for each in (state, *mids, *leaves):
        # Each State recorded the interruption once and closed its pending calls.
        assert each.pending_calls == ()
        (error,) = errors(each)
        assert error.endswith(": interrupted")
        assert [e.outcome for e in results(each)] == ["interrupted"] * len(results(each))
        assert each.stopped is None
        assert_consistent(each)
    # The interrupted calls still list the children they started.
    assert [len(e.child_ids) for e in results(state)] == [1, 1]
    for mid_state, leaf_state in zip(mids, leaves, strict=True):
        assert (leaf_state.parent_id, mid_state.parent_id) == (mid_state.id, state.id)
        assert results(mid_state)[0].child_ids == (leaf_state.id,)
    assert len(results(leaves[0])) == 1
    # What the subtree spent before the cancellation is rolled up all the same.
    assert [leaf_state.usage.requests for leaf_state in leaves] == [1, 1]
    assert [mid_state.usage.requests for mid_state in mids] == [2, 2]
    assert [e.usage.requests for e in results(state)] == [2, 2]
    assert state.usage.requests == 5
    # Every State of the tree can run again.
    state.add_message(Message.user("Go on"))
    assert await Agent(FakeModel(["Resumed."])).arun(state) == "Resumed."
    leaves[0].add_message(Message.user("Go on"))
    assert await Agent(FakeModel(["Leaf resumed."])).arun(leaves[0]) == "Leaf resumed."


# A failing child -------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("how", HOWS)
async def test_a_failing_child_becomes_its_call_error_result(how: How) -> None:
    def script(request: Request) -> Any:
        if first_text(request) == "bad":
            return RuntimeError("child model down")
        return "fine"

    helper = Agent(FakeModel([script, script]), name="helper", description="Helps.")
    bad, good = tool_call("delegate", task="bad"), tool_call("delegate", task="good")
    state = user_state()
    lead = Agent(FakeModel([[bad, good], "One helper failed."]), tools=[delegating(how, helper)])
    with anyio.fail_after(TIMEOUT):
        assert await lead.arun(state) == "One helper failed."
    failed = result_of(state, bad)
    assert failed.outcome == "error"
    assert failed.content.is_error
    assert "child model down" in failed.content.text
    (failed_id,) = failed.child_ids
    failed_child = state.child(failed_id)
    assert errors(failed_child) == ["RuntimeError: child model down"]
    assert failed_child.parent_call_id == bad.id
    assert_consistent(failed_child)
    # The sibling is not affected, and the parent went on.
    ok = result_of(state, good)
    assert (ok.outcome, ok.content.text) == ("done", "fine")
    assert state.child(ok.child_ids[0]).answer == "fine"
    assert errors(state) == []
    assert_consistent(state)


@pytest.mark.anyio
async def test_a_child_whose_tool_raises_fails_only_its_parent_call() -> None:
    @tool
    async def explode() -> str:
        """Explode."""
        raise ValueError("disk on fire")

    helper = Agent(
        FakeModel([tool_call("explode"), "never"]),
        tools=[explode],
        name="helper",
        description="Helps.",
    )
    call = tool_call("helper", task="go")
    state = user_state()
    assert await Agent(FakeModel([call, "Recovered."]), tools=[helper]).arun(state) == "Recovered."
    entry = result_of(state, call)
    assert entry.outcome == "error"
    assert "disk on fire" in entry.content.text
    child = only_child(state)
    assert errors(child) == ["ValueError: disk on fire"]
    assert [e.outcome for e in results(child)] == ["aborted"]
    assert_consistent(child)
    assert_consistent(state)


@pytest.mark.anyio
async def test_a_failing_grandchild_is_handled_by_its_own_parent() -> None:
    leaf_model = FakeModel([RuntimeError("leaf model down")])
    state = user_state()
    assert await three_levels(leaf_model=leaf_model).arun(state) == "The bug is on line 12."
    mid = only_child(state)
    (mid_result,) = results(mid)
    assert mid_result.outcome == "error"
    assert "leaf model down" in mid_result.content.text
    leaf = mid.child(mid_result.child_ids[0])
    assert errors(leaf) == ["RuntimeError: leaf model down"]
    assert leaf.usage == Usage()
    assert results(state)[0].outcome == "done"
    assert errors(mid) == errors(state) == []


@pytest.mark.anyio
async def test_a_child_cut_off_by_the_tool_timeout_is_closed_and_listed() -> None:
    @tool
    async def dig() -> str:
        """Dig forever."""
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    helper = Agent(
        FakeModel([calls(tool_call("dig"), usage=Usage(requests=1, cost=0.5))]),
        tools=[dig],
        name="helper",
        description="Digs.",
    )
    call = tool_call("helper", task="dig")
    state = user_state()
    lead = Agent(
        FakeModel([calls(call, usage=Usage(requests=1, cost=1.0)), text("ok", Usage(cost=0.0))]),
        tools=[helper],
        tool_timeout=0.05,  # only a deadline for a call that never ends; nothing is timed
    )
    with anyio.fail_after(TIMEOUT):
        assert await lead.arun(state) == "ok"
    entry = result_of(state, call)
    assert entry.outcome == "error"
    assert "timed out" in entry.content.text
    child = only_child(state)
    assert entry.child_ids == (child.id,)
    # The child was cancelled: it recorded the interruption and closed its pending call.
    (error,) = errors(child)
    assert error.endswith(": interrupted")
    assert [e.outcome for e in results(child)] == ["interrupted"]
    assert_consistent(child)
    assert entry.usage == child.usage == Usage(requests=1, cost=0.5)
    assert state.usage == Usage(requests=2, cost=1.5)
    assert errors(state) == []
    assert_consistent(state)


@pytest.mark.anyio
async def test_a_tool_failing_after_its_child_succeeded_aborts_the_run() -> None:
    """DESIGN 7: an unexpected exception of a tool aborts the run; a child that succeeded does
    not make the tool's own bug "a subagent failure"."""
    helper = Agent(FakeModel(["fine"]))
    bug = ValueError("the tool's own bug")

    @tool
    async def buggy() -> str:
        """Delegate, then fail."""
        assert await helper.arun("help") == "fine"
        raise bug

    call = tool_call("buggy")
    state = user_state()
    with pytest.raises(ValueError, match="own bug") as raised:
        await Agent(FakeModel([call, "never"]), tools=[buggy]).arun(state)
    assert raised.value is bug
    entry = result_of(state, call)
    assert entry.outcome == "aborted"
    assert "subagent" not in entry.content.text
    assert len(entry.child_ids) == 1  # the child it started is still listed
    assert_consistent(state)


# Reporter --------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_children_and_grandchildren_report_to_the_lead_reporter() -> None:
    tree = Tree()
    state = user_state()
    await three_levels(reporter=tree).arun(state)
    mid = only_child(state)
    leaf = only_child(mid)
    assert tree.problems == []
    assert tree.links == [
        (state.id, results(state)[0].call.id, mid.id),
        (mid.id, results(mid)[0].call.id, leaf.id),
    ]
    assert tree.states == {state.id: state, mid.id: mid, leaf.id: leaf}
    for each in (mid, leaf):
        hooks = [hook for hook, state_id in tree.events if state_id == each.id]
        assert hooks[:2] == ["child_start", "run_start"]
        assert hooks[-1] == "run_end"
        assert "think_end" in hooks
        assert "tool_start" in hooks
        assert "tool_end" in hooks
    # A child's whole run happens between its parent call's tool_start and tool_end.
    events = tree.events
    assert events.index(("tool_start", mid.id)) < events.index(("child_start", leaf.id))
    assert events.index(("run_end", leaf.id)) < events.index(("tool_end", mid.id))
    assert events[-1] == ("run_end", state.id)


@pytest.mark.anyio
async def test_a_child_run_from_a_sync_tool_reports_to_its_own_and_the_lead_reporter() -> None:
    # Issue 5: "children's events go to the parent's reporter too, with
    # on_child_start(parent, call, child)"; DESIGN 8: linking works "from sync tools in
    # worker threads".
    own, leads = Tree(), Tree()

    @tool
    async def look() -> str:
        """Look."""
        return "seen"

    helper = Agent(
        FakeModel([tool_call("look"), "helped"]),
        tools=[look],
        name="helper",
        description="Helps.",
        reporter=own,
    )
    state = user_state()
    lead = Agent(
        FakeModel([tool_call("delegate", task="x"), "ok"]),
        tools=[delegating("sync_tool", helper)],
        reporter=leads,
    )
    assert await lead.arun(state) == "ok"
    (kid,) = child_ids(state)
    mine = [event for event in leads.events if event[1] == kid]
    assert mine[:2] == [("child_start", kid), ("run_start", kid)]
    assert ("tool_start", kid) in mine
    assert mine[-1] == ("run_end", kid)
    assert own.events == mine
    assert ("run_end", state.id) in leads.events
    assert leads.problems == own.problems == []


# fork ------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_fork_shares_the_children_and_keeps_its_own_new_ones() -> None:
    helper = Agent(FakeModel(["first", "second"]), name="helper", description="Helps.")
    state = user_state()
    await Agent(FakeModel([tool_call("helper", task="a"), "ok"]), tools=[helper]).arun(state)
    child = only_child(state)
    before = child.snapshot()
    attempt = state.fork()
    assert attempt.id != state.id
    assert attempt.child(child.id) is child
    assert await attempt.achild(child.id) is child
    assert (child.parent_id, attempt.parent_id) == (state.id, None)
    # The fork runs on and starts a child of its own.
    attempt.add_message(Message.user("once more"))
    again = Agent(FakeModel([tool_call("helper", task="b"), "ok again"]), tools=[helper])
    await again.arun(attempt)
    new_id = child_ids(attempt)[-1]
    assert new_id != child.id
    assert attempt.child(new_id).parent_id == attempt.id
    assert attempt.child(new_id).answer == "second"
    with pytest.raises(KeyError, match="not a child"):
        state.child(new_id)
    assert child_ids(state) == [child.id]
    assert child.snapshot() == before
    assert state.child(child.id) is child


# child / achild errors without a store ---------------------------------------------------------


@pytest.mark.anyio
async def test_child_and_achild_errors_without_a_store() -> None:
    state = user_state()
    await three_levels().arun(state)
    mid = only_child(state)
    leaf = only_child(mid)
    assert state.child(mid.id) is state.child(mid.id) is mid
    assert await state.achild(mid.id) is mid
    for missing in ("nobody", leaf.id, state.id):
        with pytest.raises(KeyError, match="not a child"):
            state.child(missing)
        with pytest.raises(KeyError, match="not a child"):
            await state.achild(missing)
    # Rebuilt from the history: it knows its children's ids but cannot open them.
    rebuilt = State(history=state.history)
    with pytest.raises(ValueError, match="no store"):
        rebuilt.child(mid.id)
    with pytest.raises(ValueError, match="no store"):
        await rebuilt.achild(mid.id)
    with pytest.raises(KeyError, match="not a child"):
        rebuilt.child(leaf.id)
    with pytest.raises(ValueError, match="no store"):
        rebuilt.fork().child(mid.id)
