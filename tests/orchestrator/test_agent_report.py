"""What a run tells the outside world: Reporter hooks, permissions in the loop, structured logs,
and silence on stdout/stderr."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import structlog
import structlog.testing

from orchestrator import (
    Agent,
    Message,
    ModelReplyEntry,
    Reply,
    Reporter,
    State,
    StoppedByPermission,
    StoppedByUntil,
    ToolCall,
    ToolError,
    ToolResultEntry,
    tool,
)
from orchestrator.permissions import (
    AllowByName,
    AllowByReadOnly,
    Allowed,
    AskApproval,
    Decision,
    Denied,
    DenyByName,
    Permission,
)
from orchestrator.testing import FakeModel, tool_call
from tests.doubles import assert_consistent, read_file, result_of, results

ROOT = Path(__file__).resolve().parents[2]

# Helpers --------------------------------------------------------------------------------------


class Recorder(Reporter):
    """Records every hook as a tuple: (hook, state id, detail)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, Any]] = []
        self.problems: list[str] = []

    def on_run_start(self, state: State) -> None:
        if state.history[-1].kind != "run_start":
            self.problems.append("on_run_start before run_start was recorded")
        self.events.append(("run_start", state.id, None))

    def on_think_start(self, state: State) -> None:
        self.events.append(("think_start", state.id, state.turn))

    def on_text(self, state: State, chunk: str) -> None:
        self.events.append(("text", state.id, chunk))

    def on_think_end(self, state: State, reply: Reply) -> None:
        last = state.history[-1]
        if not (isinstance(last, ModelReplyEntry) and last.content == reply):
            self.problems.append("on_think_end before the reply was recorded")
        # Between turns: fork() works here.
        if state.fork().snapshot() != state.snapshot():
            self.problems.append("fork in on_think_end differs")
        self.events.append(("think_end", state.id, state.turn))

    def on_tool_start(self, state: State, call: ToolCall) -> None:
        self.events.append(("tool_start", state.id, call.name))

    def on_tool_end(self, state: State, call: ToolCall, entry: ToolResultEntry) -> None:
        if entry not in state.history or entry.call != call:
            self.problems.append(f"on_tool_end for {call.name} with an unrecorded entry")
        self.events.append(("tool_end", state.id, (call.name, entry.outcome)))

    def on_child_start(self, parent: State, call: ToolCall, child: State) -> None:
        self.events.append(("child_start", parent.id, (call.name, child.id)))

    def on_run_end(self, state: State, error: BaseException | None) -> None:
        self.events.append(("run_end", state.id, error))


# Reporter -------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_reporter_events_of_a_two_turn_run_with_tools_come_in_order() -> None:
    a_started = anyio.Event()
    b_done = anyio.Event()

    @tool
    async def a() -> str:
        a_started.set()
        await b_done.wait()  # a ends after b
        return "a"

    @tool
    async def b() -> str:
        await a_started.wait()  # both are running before either ends
        return "b"

    class Ordered(Recorder):
        def on_tool_end(self, state: State, call: ToolCall, entry: ToolResultEntry) -> None:
            super().on_tool_end(state, call, entry)
            if call.name == "b":
                b_done.set()

    reporter = Ordered()
    first = Reply(Message.assistant("Let me look.", [tool_call("a"), tool_call("b")]))
    state = State(messages=[Message.user("Go")])
    await Agent(FakeModel([first, "Done."]), tools=[a, b], reporter=reporter).arun(state)

    s = state.id
    events = reporter.events
    assert events[:4] == [
        ("run_start", s, None),
        ("think_start", s, 1),  # the request is recorded: its turn counts
        ("text", s, "Let me look."),
        ("think_end", s, 1),
    ]
    assert sorted(events[4:6]) == [("tool_start", s, "a"), ("tool_start", s, "b")]
    assert events[6:] == [
        ("tool_end", s, ("b", "done")),
        ("tool_end", s, ("a", "done")),
        ("think_start", s, 2),
        ("text", s, "Done."),
        ("think_end", s, 2),
        ("run_end", s, None),
    ]
    assert reporter.problems == []
    assert_consistent(state)


@pytest.mark.anyio
async def test_on_run_end_gets_the_exception_that_ended_the_run() -> None:
    failure = RuntimeError("model down")
    reporter = Recorder()
    state = State(messages=[Message.user("Go")])
    with pytest.raises(RuntimeError):
        await Agent(FakeModel([failure]), reporter=reporter).arun(state)
    assert reporter.events[-1] == ("run_end", state.id, failure)
    assert [e[0] for e in reporter.events] == ["run_start", "think_start", "run_end"]


@pytest.mark.anyio
async def test_on_run_end_gets_the_cancellation() -> None:
    entered = anyio.Event()

    @tool
    async def hang() -> str:
        entered.set()
        await anyio.sleep_forever()
        return "never"

    reporter = Recorder()
    state = State(messages=[Message.user("Go")])
    agent = Agent(FakeModel([tool_call("hang")]), tools=[hang], reporter=reporter)
    async with anyio.create_task_group() as group:
        group.start_soon(agent.arun, state)
        await entered.wait()
        group.cancel_scope.cancel()
    hook, state_id, error = reporter.events[-1]
    assert (hook, state_id) == ("run_end", state.id)
    assert isinstance(error, anyio.get_cancelled_exc_class())


@pytest.mark.anyio
async def test_children_report_to_the_parent_reporter() -> None:
    child_agent = Agent(FakeModel(["child answer"]), name="child")

    @tool
    async def delegate(task: str) -> str:
        return str(await child_agent.arun(task))

    reporter = Recorder()
    call = tool_call("delegate", task="dig")
    state = State(messages=[Message.user("Go")])
    await Agent(FakeModel([call, "ok"]), tools=[delegate], reporter=reporter).arun(state)
    (entry,) = results(state)
    (child_id,) = entry.child_ids
    child = state.child(child_id)
    assert child.parent_id == state.id
    hooks = [(hook, sid) for hook, sid, _ in reporter.events]
    start = hooks.index(("tool_start", state.id))
    end = hooks.index(("tool_end", state.id))
    assert hooks[start + 1 : end] == [
        ("child_start", state.id),
        ("run_start", child_id),
        ("think_start", child_id),
        ("text", child_id),
        ("think_end", child_id),
        ("run_end", child_id),
    ]
    assert ("child_start", state.id, ("delegate", child_id)) in reporter.events
    assert reporter.problems == []


def tool_hooks(reporter: Recorder) -> tuple[list[str], dict[str, str]]:
    """The names of the calls whose on_tool_start ran, and each on_tool_end's outcome by name."""
    started = [detail for hook, _, detail in reporter.events if hook == "tool_start"]
    ended = dict(detail for hook, _, detail in reporter.events if hook == "tool_end")
    return started, ended


@pytest.mark.anyio
async def test_a_call_cancelled_by_a_permission_stop_still_gets_on_tool_end() -> None:
    # DESIGN 6 Reporter: on_tool_end(state, call, entry) once "A tool call's result is
    # recorded". A started call closed as `cancelled` has a recorded result too.
    running = anyio.Event()

    @tool
    async def slow() -> str:
        running.set()
        await anyio.sleep_forever()
        return "never"

    @tool
    def shell() -> str:
        return "never"

    class StopAtShellOnceSlowRuns(Permission):
        """Stops the run at `shell`, once `slow` started (a call starts once it is decided)."""

        deny_first = True

        async def check(self, call: ToolCall, tool: Any | None, state: State) -> Denied | None:
            if call.name != "shell":
                return None
            await running.wait()
            return Denied("no shells", stop=True)

    reporter = Recorder()
    agent = Agent(
        FakeModel([[tool_call("slow"), tool_call("shell")]]),
        tools=[slow, shell],
        reporter=reporter,
        permissions=[AllowByName("*"), StopAtShellOnceSlowRuns()],
    )
    state = State(messages=[Message.user("go")])
    await agent.arun(state)
    assert isinstance(state.stopped, StoppedByPermission)
    outcomes = {entry.call.name: entry.outcome for entry in results(state)}
    assert outcomes == {"slow": "cancelled", "shell": "denied"}
    started, ended = tool_hooks(reporter)
    assert set(started) == set(outcomes)
    assert ended == outcomes
    assert reporter.problems == []


@pytest.mark.anyio
async def test_a_call_closed_by_a_cancellation_still_gets_on_tool_end() -> None:
    # DESIGN 6 Reporter on_tool_end(state, call, entry); a cancelled arun closes pending calls
    # ("(interrupted by user)", outcome interrupted): a recorded result, so on_tool_end.
    entered = anyio.Event()

    @tool
    async def slow() -> str:
        entered.set()
        await anyio.sleep_forever()
        return "never"

    reporter = Recorder()
    agent = Agent(FakeModel([tool_call("slow")]), tools=[slow], reporter=reporter)
    state = State(messages=[Message.user("go")])
    async with anyio.create_task_group() as group:
        group.start_soon(agent.arun, state)
        await entered.wait()
        group.cancel_scope.cancel()
    (entry,) = results(state)
    assert entry.outcome == "interrupted"
    started, ended = tool_hooks(reporter)
    assert started == ["slow"]
    assert ended == {"slow": "interrupted"}
    assert reporter.problems == []


@pytest.mark.anyio
async def test_a_call_closed_by_an_unexpected_exception_still_gets_on_tool_end() -> None:
    # DESIGN 6 Reporter on_tool_end(state, call, entry); an exception closes the call
    # ("(aborted: TypeName)"): a recorded result, so on_tool_end.
    @tool
    async def boom() -> str:
        await anyio.lowlevel.checkpoint()
        raise RuntimeError("boom")

    reporter = Recorder()
    agent = Agent(FakeModel([tool_call("boom")]), tools=[boom], reporter=reporter)
    state = State(messages=[Message.user("go")])
    with pytest.raises(RuntimeError, match="boom"):
        await agent.arun(state)
    (entry,) = results(state)
    assert entry.outcome == "aborted"
    started, ended = tool_hooks(reporter)
    assert started == ["boom"]
    assert ended == {"boom": "aborted"}
    assert reporter.problems == []


def test_a_reporter_must_be_a_reporter() -> None:
    class Duck:
        def on_run_start(self, state: State) -> None: ...

    with pytest.raises(TypeError, match="Reporter"):
        Agent(FakeModel([]), reporter=Duck())  # pyright: ignore[reportArgumentType]


# permissions in the loop ----------------------------------------------------------------------


@tool
def delete_file(path: str) -> str:
    """Delete a file."""
    return f"deleted {path}"


@pytest.mark.anyio
async def test_no_permissions_runs_every_call() -> None:
    call = tool_call("delete_file", path="a.py")
    state = State(messages=[Message.user("Go")])
    await Agent(FakeModel([call, "ok"]), tools=[delete_file]).arun(state)
    assert result_of(state, call).outcome == "done"


@pytest.mark.anyio
async def test_an_empty_permission_list_fails_closed() -> None:
    ran: list[str] = []

    @tool
    def touch(path: str) -> str:
        ran.append(path)
        return "touched"

    calls = [tool_call("touch", path="a"), tool_call("touch", path="b")]
    model = FakeModel([calls, "I may not touch files."])
    state = State(messages=[Message.user("Go")])
    answer = await Agent(model, tools=[touch], permissions=[]).arun(state)
    assert ran == []
    for call in calls:
        entry = result_of(state, call)
        assert entry.outcome == "denied"
        assert entry.content.is_error
        assert "touch" in entry.content.text
    # A denial is a result the model reads; it does not stop the run.
    assert answer == "I may not touch files."
    assert state.stopped == StoppedByUntil("waiting_for_user")
    assert len(model.requests) == 2
    assert all(b.is_error for b in model.requests[1].messages[-1].tool_results)
    assert_consistent(state)


@pytest.mark.anyio
async def test_a_call_nobody_decides_is_denied() -> None:
    calls = [tool_call("read_file", path="a"), tool_call("delete_file", path="a")]
    state = State(messages=[Message.user("Go")])
    agent = Agent(
        FakeModel([calls, "ok"]),
        tools=[read_file, delete_file],
        permissions=[AllowByName("read_*")],
    )
    await agent.arun(state)
    assert result_of(state, calls[0]).outcome == "done"
    assert result_of(state, calls[1]).outcome == "denied"
    assert_consistent(state)


@pytest.mark.anyio
async def test_deny_rules_are_asked_first_then_the_others_in_order() -> None:
    asked: list[str] = []

    class Rule(Permission):
        def __init__(self, name: str, decision: Decision | None, deny_first: bool = False) -> None:
            self.name = name
            self.decision = decision
            self.deny_first = deny_first

        async def check(self, call: ToolCall, tool: Any | None, state: State) -> Decision | None:
            asked.append(self.name)
            return self.decision

    permissions = [
        Rule("first", None),
        Rule("allow", Allowed()),
        Rule("deny-late", None, deny_first=True),
        Rule("never", Denied("not asked")),
        Rule("deny-early", None, deny_first=True),
    ]
    call = tool_call("read_file", path="a")
    state = State(messages=[Message.user("Go")])
    agent = Agent(FakeModel([call, "ok"]), tools=[read_file], permissions=permissions)
    await agent.arun(state)
    assert asked == ["deny-late", "deny-early", "first", "allow"]
    assert result_of(state, call).outcome == "done"
    assert_consistent(state)


@pytest.mark.anyio
async def test_a_deny_rule_wins_wherever_it_stands() -> None:
    calls = [tool_call("read_file", path="a"), tool_call("delete_file", path="a")]
    state = State(messages=[Message.user("Go")])
    agent = Agent(
        FakeModel([calls, "ok"]),
        tools=[read_file, delete_file],
        permissions=[AllowByName("*"), DenyByName("delete_*", reason="no deleting here")],
    )
    await agent.arun(state)
    assert result_of(state, calls[0]).outcome == "done"
    denied = result_of(state, calls[1])
    assert denied.outcome == "denied"
    assert "no deleting here" in denied.content.text
    assert state.stopped == StoppedByUntil("waiting_for_user")
    assert_consistent(state)


@pytest.mark.anyio
async def test_allow_by_read_only_and_an_approval_callback() -> None:
    asked: list[tuple[str, str]] = []

    @tool(read_only=True)
    def list_dir(path: str) -> str:
        return f"listing {path}"

    async def approve(call: ToolCall, state: State) -> bool:
        asked.append((call.name, state.id))
        return call.args["path"] != "/"

    calls = [
        tool_call("list_dir", path="/"),
        tool_call("delete_file", path="tmp"),
        tool_call("delete_file", path="/"),
    ]
    state = State(messages=[Message.user("Go")])
    agent = Agent(
        FakeModel([calls, "ok"]),
        tools=[list_dir, delete_file],
        permissions=[AllowByReadOnly(), AskApproval(approve)],
    )
    await agent.arun(state)
    assert sorted(asked) == [("delete_file", state.id), ("delete_file", state.id)]
    assert [result_of(state, c).outcome for c in calls] == ["done", "done", "denied"]
    assert "declined" in result_of(state, calls[2]).content.text
    assert_consistent(state)


@pytest.mark.anyio
async def test_a_stop_denial_cancels_the_turn_other_calls_and_stops_the_run() -> None:
    slow_started = anyio.Event()
    quick_done = anyio.Event()
    ran: list[str] = []

    class NoDeletes(Permission):
        name = "NoDeletes"

        async def check(self, call: ToolCall, tool: Any | None, state: State) -> Decision | None:
            if call.name == "delete_file":
                # One call has finished and another is running when the stop comes.
                await slow_started.wait()
                await quick_done.wait()
                return Denied("deleting stops everything", stop=True)
            return Allowed()

    @tool
    async def slow() -> str:
        slow_started.set()
        await anyio.sleep_forever()
        ran.append("slow")
        return "never"

    @tool
    async def quick() -> str:
        ran.append("quick")
        quick_done.set()  # its result is recorded before any other task runs
        return "quick"

    @tool(parallel=False)
    def after() -> str:
        ran.append("after")
        return "never"

    calls = [
        tool_call("quick"),
        tool_call("slow"),
        tool_call("delete_file", path="/"),
        tool_call("after"),
    ]
    model = FakeModel([calls, "never asked"])
    state = State(messages=[Message.user("Go")])
    agent = Agent(model, tools=[quick, slow, delete_file, after], permissions=[NoDeletes()])
    with anyio.fail_after(10):
        await agent.arun(state)
    assert ran == ["quick"]
    outcomes = [result_of(state, c).outcome for c in calls]
    assert outcomes == ["done", "cancelled", "denied", "cancelled"]
    assert "deleting stops everything" in result_of(state, calls[2]).content.text
    assert all(result_of(state, c).content.is_error for c in calls[1:])
    assert state.stopped == StoppedByPermission(calls[2], "NoDeletes")
    assert not state.finished
    assert len(model.requests) == 1
    assert [e.kind for e in state.history].count("stop") == 1
    assert_consistent(state)
    # Not finished: add a message and run again.
    state.add_message(Message.user("Do not delete anything."))
    assert await Agent(FakeModel(["Understood."])).arun(state) == "Understood."
    assert state.stopped == StoppedByUntil("waiting_for_user")
    assert_consistent(state)


@pytest.mark.anyio
async def test_deny_by_name_with_stop_names_itself_in_stopped() -> None:
    calls = [tool_call("read_file", path="a"), tool_call("delete_file", path="a")]
    rule = DenyByName("delete_*", stop=True)
    model = FakeModel([calls, "never"])
    state = State(messages=[Message.user("Go")])
    agent = Agent(model, tools=[read_file, delete_file], permissions=[AllowByName("*"), rule])
    await agent.arun(state)
    assert state.stopped == StoppedByPermission(calls[1], rule.name)
    assert result_of(state, calls[1]).outcome == "denied"
    assert result_of(state, calls[0]).outcome in ("done", "cancelled")
    assert len(model.requests) == 1
    assert_consistent(state)


@pytest.mark.anyio
async def test_a_declined_approval_with_deny_stop_stops_the_run() -> None:
    call = tool_call("delete_file", path="a")
    model = FakeModel([call, "never"])
    state = State(messages=[Message.user("Go")])
    rule = AskApproval(lambda call, state: False, deny_stop=True)
    await Agent(model, tools=[delete_file], permissions=[rule]).arun(state)
    assert isinstance(state.stopped, StoppedByPermission)
    assert state.stopped.call == call
    assert result_of(state, call).outcome == "denied"
    assert len(model.requests) == 1
    assert_consistent(state)


@pytest.mark.anyio
async def test_a_permission_returning_nonsense_is_a_clear_error() -> None:
    class Broken(Permission):
        async def check(self, call: ToolCall, tool: Any | None, state: State) -> Decision | None:
            return "yes"  # pyright: ignore[reportReturnType]

    call = tool_call("read_file", path="a")
    state = State(messages=[Message.user("Go")])
    with pytest.raises(TypeError, match="Broken"):
        await Agent(FakeModel([call, "ok"]), tools=[read_file], permissions=[Broken()]).arun(state)
    assert result_of(state, call).outcome == "aborted"
    assert_consistent(state)


# structured logging ---------------------------------------------------------------------------


@pytest.fixture
def debug_logging() -> Iterator[None]:
    """Let the app's logging see the library's debug events, as an app that opts in would."""
    logger = logging.getLogger("orchestrator")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        logger.setLevel(level)


@pytest.mark.anyio
@pytest.mark.usefixtures("debug_logging")
async def test_log_events_carry_the_state_turn_and_call() -> None:
    calls = [tool_call("read_file", path="a"), tool_call("read_file", path="b")]
    state = State(messages=[Message.user("Go")])
    with structlog.testing.capture_logs() as logs:
        await Agent(FakeModel([calls, "ok"]), tools=[read_file], name="reader").arun(state)
    events = [log["event"] for log in logs]
    assert events[0] == "state.run.started"
    assert events[-1] == "state.run.finished"
    finished = [log for log in logs if log["event"] == "state.tool.finished"]
    assert sorted(log["call_id"] for log in finished) == sorted(c.id for c in calls)
    for log in finished:
        assert log["state_id"] == state.id
        assert log["turn"] == 1
        assert log["tool"] == "read_file"
        assert log["outcome"] == "done"
    assert all(log["state_id"] == state.id for log in logs)
    started = logs[0]
    assert started["agent"] == "reader"
    assert logs[-1]["error"] is None


@pytest.mark.anyio
@pytest.mark.usefixtures("debug_logging")
async def test_a_tool_that_raises_is_logged_as_a_warning_with_its_call() -> None:
    @tool
    def explode() -> str:
        raise RuntimeError("kaboom")

    call = tool_call("explode")
    state = State(messages=[Message.user("Go")])
    with structlog.testing.capture_logs() as logs, pytest.raises(RuntimeError):
        await Agent(FakeModel([call]), tools=[explode]).arun(state)
    (raised,) = [log for log in logs if log["event"] == "state.tool.raised"]
    assert raised["log_level"] == "warning"
    assert raised["state_id"] == state.id
    assert raised["call_id"] == call.id
    assert "kaboom" in str(raised["error"])
    assert "kaboom" in str(logs[-1]["error"])


@pytest.mark.anyio
async def test_log_events_go_through_the_standard_library(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="orchestrator")
    call = tool_call("read_file", path="a")
    state = State(messages=[Message.user("Go")])
    await Agent(FakeModel([call, "ok"]), tools=[read_file]).arun(state)
    ours = [r for r in caplog.records if r.name.startswith("orchestrator.")]
    assert any("state.tool.finished" in r.getMessage() for r in ours)
    assert any(call.id in r.getMessage() for r in ours)


# quiet ----------------------------------------------------------------------------------------


def _noisy_run() -> None:
    @tool
    def fails() -> str:
        raise ToolError("not found")

    @tool
    def explodes() -> str:
        raise RuntimeError("kaboom")

    calls = [tool_call("fails"), tool_call("read_file", path="a")]
    Agent(FakeModel([calls, "ok"]), tools=[fails, read_file]).run("Go")
    with pytest.raises(RuntimeError):
        Agent(FakeModel([tool_call("explodes")]), tools=[explodes]).run("Go")


def test_a_run_prints_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    _noisy_run()
    out, err = capfd.readouterr()
    assert out == ""
    assert err == ""


@pytest.mark.anyio
async def test_an_async_run_prints_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    @tool
    async def fails() -> str:
        raise ToolError("not found")

    state = State(messages=[Message.user("Go")])
    await Agent(FakeModel([tool_call("fails"), "ok"]), tools=[fails]).arun(state)
    out, err = capfd.readouterr()
    assert out == ""
    assert err == ""


def test_a_fresh_process_running_agents_with_warnings_shown_prints_nothing() -> None:
    # DESIGN 3: "A library is quiet: it never prints and never configures logging ... nothing
    # shows until the app configures logging"; issue 3: "nothing printed to stdout/stderr" -
    # with every warning shown, through timeouts, tool errors, unknown tools, denials,
    # subagents, bad arguments, cancellation and exceptions, on asyncio and trio.
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


def test_a_fresh_process_without_logging_configured_stays_silent() -> None:
    script = textwrap.dedent(
        """
        import logging
        import structlog
        from orchestrator import Agent, ToolError, tool
        from orchestrator.testing import FakeModel, tool_call

        @tool
        def fails() -> str:
            raise ToolError("not found")

        @tool
        def explodes() -> str:
            raise RuntimeError("kaboom")

        Agent(FakeModel([tool_call("fails"), "ok"]), tools=[fails]).run("Go")
        try:
            Agent(FakeModel([tool_call("explodes")]), tools=[explodes]).run("Go")
        except RuntimeError:
            pass
        else:
            raise SystemExit(3)
        # The library configured nothing.
        if logging.getLogger().handlers or structlog.is_configured():
            raise SystemExit(4)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
