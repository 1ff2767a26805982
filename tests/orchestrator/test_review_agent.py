"""Review tests for `Agent`, the loop, tools and reporting against DESIGN sections 3-7.

Each test cites the sentence it checks. Some of them fail on purpose: they prove a gap.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Annotated, Any

import anyio
import anyio.lowlevel
import pytest
from pydantic import BaseModel, Field

import orchestrator
from orchestrator import (
    Agent,
    ErrorEntry,
    Loop,
    Message,
    OutputError,
    RawBlock,
    Reply,
    Reporter,
    State,
    StoppedByFinish,
    StoppedByLimit,
    StoppedByPermission,
    StoppedByUntil,
    ToolCall,
    ToolResult,
    ToolResultEntry,
    Usage,
    loop,
    tool,
    waiting_for_user,
)
from orchestrator.models import Request, TextCallback
from orchestrator.permissions import AllowByName, DenyByName
from orchestrator.testing import FakeModel, tool_call

ROOT = Path(__file__).resolve().parents[2]


def results(state: State) -> list[ToolResultEntry]:
    return [e for e in state.history if isinstance(e, ToolResultEntry) and not e.late]


def assert_replays(state: State) -> None:
    assert State(history=state.history).snapshot() == state.snapshot()


class HangModel:
    """A model whose request never returns; `entered` is set when it arrives."""

    def __init__(self) -> None:
        self.entered = anyio.Event()

    @property
    def name(self) -> str:
        return "hang"

    @property
    def context_window(self) -> int | None:
        return None

    async def respond(self, request: Request, *, on_text: TextCallback | None = None) -> Reply:
        self.entered.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


class ToolPairs(Reporter):
    """Records which calls started and the outcome each on_tool_end reported."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.ended: dict[str, str] = {}

    def on_tool_start(self, state: State, call: ToolCall) -> None:
        self.started.append(call.id)

    def on_tool_end(self, state: State, call: ToolCall, entry: ToolResultEntry) -> None:
        self.ended[call.id] = entry.outcome


# @loop ------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_loop_called_again_from_a_plain_loop_runs_after_its_until_stop() -> None:
    # Seed 004 stopped: "A @loop called inside such a loop leaves its until/limit reason set, so a
    # loop without @loop that calls one checks only for StoppedByFinish/StoppedByPermission";
    # DESIGN 6: a @loop checks "a decided stop (finish, permission stop)", then until, then limit.
    @loop(until=[waiting_for_user], limit=5)
    async def inner(agent: Agent, state: State) -> None:
        await agent.athink(state)
        if state.pending_calls:
            await agent.ause_tools(state)

    async def outer(agent: Agent, state: State) -> None:
        for text in ("second", "third", None):
            await inner(agent, state)
            if isinstance(state.stopped, StoppedByFinish | StoppedByPermission) or text is None:
                return
            state.add_message(Message.user(text))

    model = FakeModel(["a", "b", "c"])
    state = State(messages=[Message.user("first")])
    await Agent(model, loop=outer).arun(state)
    assert [m.text for m in state.messages] == ["first", "a", "second", "b", "third", "c"]
    assert len(model.requests) == 3
    assert state.stopped == StoppedByUntil("waiting_for_user")


@pytest.mark.anyio
async def test_until_functions_are_checked_in_order_and_the_first_true_one_is_named() -> None:
    # DESIGN 6: before each turn "each until function (StoppedByUntil(fn.__name__))", in order.
    def never(state: State) -> bool:
        return False

    def after_one(state: State) -> bool:
        return state.turn >= 1

    def also_after_one(state: State) -> bool:
        return state.turn >= 1

    @loop(until=[never, after_one, also_after_one], limit=9)
    async def body(agent: Agent, state: State) -> None:
        await agent.athink(state)

    state = State(messages=[Message.user("go")])
    await Agent(FakeModel(["x", "y"]), loop=body).arun(state)
    assert state.stopped == StoppedByUntil("after_one")
    assert state.turn == 1


@pytest.mark.anyio
async def test_the_default_loop_stops_with_stopped_by_limit_50() -> None:
    # DESIGN 6: "The default loop: until=waiting_for_user, limit=50, body = think, then use_tools".
    @tool
    def noop() -> None:
        return None

    model = FakeModel([tool_call("noop") for _ in range(60)])
    state = State(messages=[Message.user("Loop forever")])
    await Agent(model, tools=[noop]).arun(state)
    assert state.stopped == StoppedByLimit(50)
    assert len(model.requests) == 50
    assert state.turn == 50
    assert state.pending_calls == ()


def test_loop_misuse_errors_say_how_to_fix_it() -> None:
    # DESIGN 3: "every misuse raises TypeError/ValueError whose message names the problem and the
    # fix"; DESIGN 6: the form is @loop(until=[...], limit=N).
    def body(agent: Agent, state: State) -> None:
        return None

    # Resolved by accepting both forms a user reaches for: bare @loop, and one until function.
    bare = loop(body)
    assert isinstance(bare, Loop)
    assert bare.until == ()
    assert bare.limit == 50
    single = loop(until=waiting_for_user)(body)
    assert single.until == (waiting_for_user,)
    with pytest.raises(TypeError, match=re.escape("@loop(until=...)")):
        loop(until=5)  # pyright: ignore[reportArgumentType]  # neither a function nor a list


# sync / async twins -----------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("method", ["think", "use_tools", "compact"])
async def test_sync_methods_on_an_event_loop_thread_name_their_async_twin(method: str) -> None:
    # DESIGN 6: "Sync methods called on a thread that runs an event loop raise TypeError naming
    # the async twin."
    model = FakeModel(["never"])
    state = State(messages=[Message.user("go")])
    before = state.snapshot()
    with pytest.raises(TypeError, match=f"a{method}"):
        getattr(Agent(model), method)(state)
    assert model.requests == []
    assert state.snapshot() == before


# reporting --------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_call_cancelled_by_a_permission_stop_still_gets_on_tool_end() -> None:
    # DESIGN 6 Reporter: on_tool_end(state, call, entry); Reporter docstring: "A tool call's
    # result is recorded". A started call closed as `cancelled` has a recorded result too.
    @tool
    async def slow() -> str:
        await anyio.sleep_forever()
        return "never"

    @tool
    def shell() -> str:
        return "never"

    reporter = ToolPairs()
    model = FakeModel([[tool_call("slow"), tool_call("shell")]])
    agent = Agent(
        model,
        tools=[slow, shell],
        reporter=reporter,
        permissions=[AllowByName("*"), DenyByName("shell", stop=True)],
    )
    state = State(messages=[Message.user("go")])
    await agent.arun(state)
    assert isinstance(state.stopped, StoppedByPermission)
    outcomes = {entry.call.id: entry.outcome for entry in results(state)}
    assert sorted(outcomes.values()) == ["cancelled", "denied"]
    assert set(reporter.started) == set(outcomes)
    assert reporter.ended == outcomes


@pytest.mark.anyio
async def test_a_call_closed_by_a_cancellation_still_gets_on_tool_end() -> None:
    # DESIGN 6 Reporter on_tool_end(state, call, entry); cancelled arun: pending calls are closed
    # ("(interrupted by user)", outcome interrupted): a recorded result, so on_tool_end.
    entered = anyio.Event()

    @tool
    async def slow() -> str:
        entered.set()
        await anyio.sleep_forever()
        return "never"

    reporter = ToolPairs()
    agent = Agent(FakeModel([tool_call("slow")]), tools=[slow], reporter=reporter)
    state = State(messages=[Message.user("go")])
    async with anyio.create_task_group() as group:
        group.start_soon(agent.arun, state)
        await entered.wait()
        group.cancel_scope.cancel()
    (entry,) = results(state)
    assert entry.outcome == "interrupted"
    assert reporter.started == [entry.call.id]
    assert reporter.ended == {entry.call.id: "interrupted"}


@pytest.mark.anyio
async def test_a_call_closed_by_an_unexpected_exception_still_gets_on_tool_end() -> None:
    # DESIGN 6 Reporter on_tool_end(state, call, entry); an exception closes the call
    # ("(aborted: TypeName)"): a recorded result, so on_tool_end.
    @tool
    async def boom() -> str:
        await anyio.lowlevel.checkpoint()
        raise RuntimeError("boom")

    reporter = ToolPairs()
    agent = Agent(FakeModel([tool_call("boom")]), tools=[boom], reporter=reporter)
    state = State(messages=[Message.user("go")])
    with pytest.raises(RuntimeError, match="boom"):
        await agent.arun(state)
    (entry,) = results(state)
    assert entry.outcome == "aborted"
    assert reporter.started == [entry.call.id]
    assert reporter.ended == {entry.call.id: "aborted"}


# typed data in one turn -------------------------------------------------------------------------

PAIRS_SCHEMA: dict[str, Any] = {"items": {"type": Annotated[list[int], Field(max_length=2)]}}


@pytest.mark.anyio
async def test_a_state_update_failing_validation_at_the_turn_end_is_refused_with_a_notice() -> None:
    # DESIGN 5a: updates are "applied when the turn's last result is recorded, in request
    # order"; "An update that fails validation turns that call's result into an error result
    # and is not applied." It must not abort the run.
    @tool
    def add_pair(n: int) -> ToolResult:
        return ToolResult(f"added {n}", state={"items": [n, n]})

    model = FakeModel([[tool_call("add_pair", n=1), tool_call("add_pair", n=2)], "done"])
    agent = Agent(model, tools=[add_pair], state_schema=PAIRS_SCHEMA)
    state = State(messages=[Message.user("go")])
    assert await agent.arun(state) == "done"
    assert state.get("items") == [1, 1]
    # The results are already in the messages when the merge fails at the turn's end, so the
    # refused update is not applied and a notice right after the results tells the model.
    notices = [m.text for m in state.messages if m.is_notice]
    assert len(notices) == 1
    assert "Not applied, the state update of add_pair" in notices[0]
    assert "items" in notices[0]
    assert_replays(state)


# nothing left running ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_sync_tool_that_times_out_is_not_left_running_after_arun_returns() -> None:
    # DESIGN 3: "every task lives in a task group; nothing runs in the background after a call
    # returns"; DESIGN 6/7 per-tool `timeout`.
    started = threading.Event()
    release = threading.Event()
    finished = threading.Event()

    @tool(timeout=0.05)
    def stuck() -> str:
        started.set()
        try:
            release.wait(1.0)
        finally:
            finished.set()
        return "late"

    def second_reply(request: Request) -> str:
        started.wait(2.0)  # the tool's thread has surely begun before the run can end
        return "done"

    agent = Agent(FakeModel([tool_call("stuck"), second_reply]), tools=[stuck])
    state = State(messages=[Message.user("go")])
    try:
        await agent.arun(state)
        (entry,) = results(state)
        assert entry.outcome == "error"
        assert finished.is_set(), "the tool's worker thread still runs after arun returned"
    finally:
        release.set()
        finished.wait(2.0)


@pytest.mark.anyio
async def test_no_task_is_left_running_after_a_cancelled_arun() -> None:
    # DESIGN 3: "nothing runs in the background after a call returns; cancelling a parent cancels
    # its whole subtree"; DESIGN 6: "children are cancelled too".
    entered = anyio.Event()

    @tool
    async def wait_forever() -> str:
        entered.set()
        await anyio.sleep_forever()
        return "never"

    child_model = HangModel()
    helper = Agent(child_model, name="helper", description="Helps with a task")
    model = FakeModel(
        [[tool_call("wait_forever"), tool_call("wait_forever"), tool_call("helper", task="x")]]
    )
    agent = Agent(model, tools=[wait_forever, helper])
    state = State(messages=[Message.user("go")])
    before = {task.id for task in anyio.get_running_tasks()}
    async with anyio.create_task_group() as group:
        group.start_soon(agent.arun, state)
        await entered.wait()
        await child_model.entered.wait()
        group.cancel_scope.cancel()
    assert {task.id for task in anyio.get_running_tasks()} == before
    assert sorted(e.outcome for e in results(state)) == ["interrupted"] * 3
    (child_id,) = [c for e in results(state) for c in e.child_ids]
    child = state.child(child_id)
    assert child.pending_calls == ()
    assert child.turn == 0


# cancellation recorded once ---------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_cancelled_run_with_a_sync_loop_body_records_the_interruption_once() -> None:
    # DESIGN 6: "when arun is cancelled ... the error is recorded once"; sync methods called from
    # a worker thread of a running run "hop onto that loop" (a sync @loop body runs in one).
    model = HangModel()

    @loop(until=[waiting_for_user], limit=3)
    def body(agent: Agent, state: State) -> None:
        agent.think(state)

    agent = Agent(model, loop=body)
    state = State(messages=[Message.user("go")])
    async with anyio.create_task_group() as group:
        group.start_soon(agent.arun, state)
        await model.entered.wait()
        group.cancel_scope.cancel()
    errors = [e.content for e in state.history if isinstance(e, ErrorEntry)]
    assert len(errors) == 1, errors
    assert state.turn == 0
    assert_replays(state)


# usage ------------------------------------------------------------------------------------------


class Rating(BaseModel):
    score: int


@pytest.mark.anyio
async def test_an_ask_that_fails_after_a_reply_still_counts_the_usage_spent() -> None:
    # Seed 004 usage: "Total tokens, requests and cost of every think, ask and compact on this
    # State"; DESIGN 6 ask "retries on a bad format". The first reply's tokens were spent.
    model = FakeModel(
        [
            Reply(Message.assistant("not json"), Usage(input_tokens=7, requests=1)),
            RuntimeError("down"),
        ]
    )
    state = State(messages=[Message.user("Rate it")])
    with pytest.raises(RuntimeError, match="down"):
        await Agent(model).aask(state, "Give a score", Rating, retries=1)
    assert state.usage == Usage(input_tokens=7, requests=1)
    assert_replays(state)


@pytest.mark.anyio
async def test_a_compaction_with_an_empty_summary_still_counts_the_usage_spent() -> None:
    # Seed 004 usage: "Total tokens, requests and cost of every think, ask and compact on this
    # State" (an ask with no valid answer counts its usage; a compaction must too).
    model = FakeModel([Reply(Message.assistant("   "), Usage(input_tokens=50, requests=1))])
    state = State(messages=[Message.user("Find the bug"), Message.assistant("Looking")])
    with pytest.raises(OutputError):
        await Agent(model).acompact(state)
    assert state.messages[1].text == "Looking"
    assert state.usage == Usage(input_tokens=50, requests=1)
    assert_replays(state)


# FakeModel --------------------------------------------------------------------------------------


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


# max_concurrency --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_without_max_concurrency_every_parallel_sync_call_runs_at_once() -> None:
    # DESIGN 7: "all parallel=True calls of a turn start at once in one task group (... sync tools
    # in worker threads through one CapacityLimiter, max_concurrency)"; Agent.max_concurrency:
    # "None: all parallel calls".
    count = 70
    barrier = threading.Barrier(count, timeout=2.0)

    @tool
    def meet(i: int) -> str:
        barrier.wait()
        return "met"

    model = FakeModel([[tool_call("meet", i=i) for i in range(count)], "done"])
    state = State(messages=[Message.user("go")])
    try:
        await Agent(model, tools=[meet]).arun(state)
    finally:
        barrier.abort()
    assert [e.outcome for e in results(state)] == ["done"] * count


# logging ----------------------------------------------------------------------------------------


def test_a_fresh_process_running_agents_with_warnings_shown_prints_nothing() -> None:
    # DESIGN 3: "A library is quiet: it never prints and never configures logging ... nothing
    # shows until the app configures logging"; issue 3: "nothing printed to stdout/stderr".
    script = textwrap.dedent(
        """
        import anyio
        from orchestrator import Agent, ToolError, tool
        from orchestrator.permissions import AllowByName, DenyByName
        from orchestrator.testing import FakeModel, tool_call

        @tool(timeout=0.01)
        async def slow() -> str:
            await anyio.sleep(5)
            return "never"

        @tool
        def fails() -> str:
            raise ToolError("not found")

        @tool
        def explodes() -> str:
            raise RuntimeError("kaboom")

        @tool
        def shell() -> str:
            return "never"

        async def main() -> None:
            child = Agent(FakeModel(["child answer"]), name="child", description="A child")
            calls = [tool_call(n) for n in ("slow", "fails", "nosuch", "shell")]
            calls.append(tool_call("child", task="x"))
            calls.append(tool_call("fails", extra=1))
            agent = Agent(
                FakeModel([calls, "done"]),
                tools=[slow, fails, shell, child],
                permissions=[AllowByName("*"), DenyByName("shell")],
            )
            await agent.arun("go")
            with anyio.move_on_after(0.01):
                await Agent(FakeModel([tool_call("slow")]), tools=[slow]).arun("go")
            try:
                await Agent(FakeModel([tool_call("explodes")]), tools=[explodes]).arun("go")
            except RuntimeError:
                pass
            try:
                await Agent(FakeModel([])).arun("go")
            except AssertionError:
                pass

        for backend in ("asyncio", "trio"):
            anyio.run(main, backend=backend)
        """
    )
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


# public API -------------------------------------------------------------------------------------


def test_the_public_api_has_the_design_names_and_signatures() -> None:
    # DESIGN 3 (explicit __all__), 4 (Message/blocks/Reply/Usage), 6 (Agent), 7 (ToolSpec,
    # ToolResult), 11 (FakeModel, tool_call(name, /, **args)).
    names = set(orchestrator.__all__)
    assert {
        "Agent",
        "ConsoleReporter",
        "Image",
        "Memory",
        "Message",
        "RawBlock",
        "ReasoningBlock",
        "Reply",
        "Reporter",
        "State",
        "StateSnapshot",
        "TextBlock",
        "Tool",
        "ToolCall",
        "ToolError",
        "ToolResult",
        "ToolResultBlock",
        "ToolSpec",
        "Usage",
        "loop",
        "tool",
        "waiting_for_user",
    } <= names

    def params(obj: Any) -> list[tuple[str, Any, Any]]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(obj).parameters.values()]

    empty = inspect.Parameter.empty
    keyword = inspect.Parameter.KEYWORD_ONLY
    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert [(n, k) for n, k, _ in params(orchestrator.Reply)] == [
        ("message", positional),
        ("usage", positional),
        ("stop_reason", positional),
        ("model", positional),
    ]
    assert [n for n, _, _ in params(orchestrator.Usage)] == [
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
        "requests",
        "cost",
    ]
    assert Usage() == Usage(0, 0, 0, 0, 0, None)
    assert params(tool_call) == [
        ("name", inspect.Parameter.POSITIONAL_ONLY, empty),
        ("args", inspect.Parameter.VAR_KEYWORD, empty),
    ]
    assert tool_call("t", name="n").args == {"name": "n"}
    agent = params(Agent)
    assert agent[0][:2] == ("model", positional)
    assert [(n, k, d) for n, k, d in agent[1:]] == [
        (name, keyword, default)
        for name, default in [
            ("instructions", None),
            ("tools", ()),
            ("name", None),
            ("description", None),
            ("store", None),
            ("state_schema", None),
            ("collections", None),
            ("permissions", None),
            ("reporter", None),
            ("loop", None),
            ("max_concurrency", None),
            ("tool_timeout", None),
            ("max_turns", None),  # issue 12: the default loop's limit
            ("runner", None),  # issue 15: where the subagent tools' children run
        ]
    ]
    assert [n for n, _, _ in params(orchestrator.ToolSpec)] == [
        "name",
        "description",
        "input_schema",
    ]
    assert [(n, d) for n, _, d in params(orchestrator.ToolResult)] == [
        ("message", None),
        ("state", None),
        ("is_error", False),
    ]
    for twin in ("run", "think", "use_tools", "ask", "compact"):
        assert inspect.iscoroutinefunction(getattr(Agent, "a" + twin))
        assert not inspect.iscoroutinefunction(getattr(Agent, twin))
    assert callable(orchestrator.Image.from_path)
    assert callable(orchestrator.Image.from_base64)
    assert Message.notice("x").text == "[notice] x"
    assert Message.notice("x").is_notice
