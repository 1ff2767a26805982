"""ConsoleReporter: the live tree, drawn to a rich Console we can read."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from orchestrator import Agent, ConsoleReporter, Message, State, tool
from orchestrator.testing import FakeModel, tool_call


def _console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=120, force_terminal=False, color_system=None), out


@tool
def grep(pattern: str) -> str:
    """Search the code."""
    return f"found {pattern}"


def test_draws_the_tree_of_states_calls_and_children() -> None:
    console, out = _console()
    reporter = ConsoleReporter(console)
    researcher = Agent(
        FakeModel(["b.py:12"]), name="researcher", description="Finds where things are"
    )
    lead = Agent(
        FakeModel(
            [[tool_call("researcher", task="find it"), tool_call("grep", pattern="x")], "ok"]
        ),
        tools=[researcher, grep],
        reporter=reporter,
        name="lead",
    )
    state = State(messages=[Message.user("go")])
    assert lead.run(state) == "ok"
    tree = out.getvalue()
    final = tree[tree.rfind("orchestrator") :]
    assert "lead" in final
    assert "researcher done" in final
    assert "grep done" in final
    (child_id,) = [cid for e in state.history if e.kind == "tool_result" for cid in e.child_ids]
    assert child_id[:8] in final
    # the child hangs under the call that started it: it comes after that call's line
    assert final.index(child_id[:8]) > final.index("researcher done")


def test_a_failed_run_is_shown_failed() -> None:
    console, out = _console()
    agent = Agent(FakeModel([RuntimeError("model down")]), reporter=ConsoleReporter(console))
    with pytest.raises(RuntimeError):
        agent.run("go")
    assert "failed: RuntimeError" in out.getvalue()


def test_streamed_text_is_shown_and_can_be_hidden() -> None:
    console, out = _console()
    Agent(FakeModel(["a streamed answer"]), reporter=ConsoleReporter(console)).run("go")
    assert "a streamed answer" in out.getvalue()
    console, out = _console()
    Agent(FakeModel(["hidden words"]), reporter=ConsoleReporter(console, show_text=False)).run("go")
    assert "hidden words" not in out.getvalue()


def test_a_deferred_call_is_shown_awaiting_approval_not_running() -> None:
    from orchestrator.permissions import ApproveLater

    console, out = _console()
    agent = Agent(
        FakeModel([tool_call("grep", pattern="x")]),
        tools=[grep],
        reporter=ConsoleReporter(console),
        permissions=[ApproveLater("grep")],
    )
    agent.run("go")
    tree = out.getvalue()
    final = tree[tree.rfind("orchestrator") :]
    assert "grep awaiting approval" in final
    assert "grep running" not in final
