"""A real crash: a process dies inside a tool or a model call, and the next one runs the State on.

Each test runs an Agent with a `FakeModel` and a `FileStore` in a subprocess that calls
``os._exit(1)`` mid-turn (nothing is cleaned up, nothing is flushed), then loads the State in
this process, checks how it was recovered, and runs it on to an answer with a new Agent.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from orchestrator import Agent, ErrorEntry, Message, State, tool
from orchestrator.testing import FakeModel
from stores import FileStore
from tests.doubles import bound_store, results

ROOT = Path(__file__).resolve().parents[2]

PRELUDE = """
import os, sys
from orchestrator import Agent, Message, State, tool
from orchestrator.testing import FakeModel, tool_call
from stores import FileStore

@tool
def check(name: str) -> str:
    \"\"\"Check a service.\"\"\"
    return f"{name} is up"

@tool(parallel=False)
def deploy(target: str) -> str:
    \"\"\"Deploy to a target.\"\"\"
    os._exit(1)

store = FileStore(sys.argv[1])
state = State(id="crashed", messages=[Message.user("Deploy the app")])
"""


def run_until_crash(script: str, folder: Path) -> None:
    code = PRELUDE + textwrap.dedent(script)
    done = subprocess.run(
        [sys.executable, "-c", code, str(folder)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""


@tool
def check(name: str) -> str:
    """Check a service."""
    return f"{name} is up"


@tool(parallel=False)
def deploy(target: str) -> str:
    """Deploy to a target."""
    return f"deployed to {target}"


def test_a_crash_inside_a_tool_leaves_an_unknown_result(tmp_path: Path) -> None:
    run_until_crash(
        """
        model = FakeModel([[tool_call("check", name="db"), tool_call("deploy", target="prod")]])
        Agent(model, tools=[check, deploy], store=store).run(state)
        """,
        tmp_path,
    )
    store = FileStore(tmp_path)
    stored = store.list()[0].entries
    state = store.load("crashed")
    assert bound_store(state) is store  # private: the binding has no public accessor
    assert [(entry.call.name, entry.outcome) for entry in results(state)] == [
        ("check", "done"),
        ("deploy", "unknown"),
    ]
    unknown = results(state)[-1]
    assert unknown.seq == stored  # the only entry the load added
    assert unknown.content.is_error
    assert "may or may not have run" in unknown.content.text
    assert state.pending_calls == ()
    assert [block.text for block in state.messages[-1].tool_results] == [
        "db is up",
        unknown.content.text,
    ]
    assert state.turn == 1

    model = FakeModel(["The deploy may not have happened: I will check prod before retrying."])
    answer = Agent(model, tools=[check, deploy], store=store).run(state)
    assert isinstance(answer, str)
    assert answer.startswith("The deploy may not have happened")
    assert model.requests[0].messages == state.messages[:-1]  # the model saw the unknown result
    again = FileStore(tmp_path).load("crashed")
    assert again.snapshot() == state.snapshot()
    assert [entry.outcome for entry in results(again)] == ["done", "unknown"]


def test_a_crash_inside_the_model_call_takes_the_request_back(tmp_path: Path) -> None:
    # The Agent saves the request before it waits on the model, so the cut-off request is on
    # disk and loading takes it back: the turn it started does not count.
    run_until_crash(
        """
        def crash(request):
            os._exit(1)

        model = FakeModel([tool_call("check", name="db"), crash])
        Agent(model, tools=[check, deploy], store=store).run(state)
        """,
        tmp_path,
    )
    store = FileStore(tmp_path)
    state = store.load("crashed")
    kinds = [entry.kind for entry in state.history]
    assert kinds[-3:] == ["tool_result", "model_request", "error"]
    last = state.history[-1]
    assert last.kind == "error"
    assert "taken back" in last.content
    assert len(state.history) == store.list()[0].entries + 1  # the recovery, not saved yet
    assert state.turn == 1
    assert_runs_on(state, store, tmp_path)


def test_a_request_saved_before_the_crash_is_taken_back(tmp_path: Path) -> None:
    # The model call saves the State first (as a save point before each call would), then dies
    # while the request waits on the model.
    run_until_crash(
        """
        def crash(request):
            store.save(state)
            os._exit(1)

        model = FakeModel([tool_call("check", name="db"), crash])
        Agent(model, tools=[check, deploy], store=store).run(state)
        """,
        tmp_path,
    )
    store = FileStore(tmp_path)
    stored = store.list()[0].entries
    state = store.load("crashed")
    kinds = [entry.kind for entry in state.history]
    assert kinds[-3:] == ["tool_result", "model_request", "error"]
    error = state.history[-1]
    assert isinstance(error, ErrorEntry)
    assert error.seq == stored  # the only entry the load added
    assert "taken back" in error.content
    assert state.turn == 1  # the cut-off request no longer counts
    assert_runs_on(state, store, tmp_path)
    again = FileStore(tmp_path).load("crashed")
    assert [entry.kind for entry in again.history].count("error") == 1


def assert_runs_on(state: State, store: FileStore, folder: Path) -> None:
    """A new Agent runs the recovered State to an answer; the store then holds that State."""
    assert state.pending_calls == ()
    assert [block.text for block in state.messages[-1].tool_results] == ["db is up"]
    model = FakeModel(["The database is up."])
    assert Agent(model, tools=[check, deploy], store=store).run(state) == "The database is up."
    assert model.requests[0].messages[-1].tool_results[0].text == "db is up"
    again = FileStore(folder).load("crashed")
    assert again.snapshot() == state.snapshot()
    assert again.answer == "The database is up."


def test_the_recovered_entries_are_saved_once(tmp_path: Path) -> None:
    run_until_crash(
        """
        model = FakeModel([tool_call("deploy", target="prod")])
        Agent(model, tools=[deploy], store=store).run(state)
        """,
        tmp_path,
    )
    store = FileStore(tmp_path)
    stored = store.list()[0].entries
    first = store.load("crashed")
    assert len(first.history) == stored + 1
    assert FileStore(tmp_path).list()[0].entries == stored  # a load writes nothing
    store.save(first)
    assert FileStore(tmp_path).list()[0].entries == stored + 1
    second = FileStore(tmp_path).load("crashed")
    assert second.snapshot() == first.snapshot()
    second.add_message(Message.user("Did it deploy?"))
    FileStore(tmp_path).save(second)
    assert FileStore(tmp_path).list()[0].entries == stored + 2
