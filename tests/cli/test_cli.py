"""The `orchestrator` command on stores written by running agents: text, JSON and errors."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner, Result

from orchestrator import Agent, Message, Reply, State, Usage

# Private: the CLI's entry point, called in-process (the command runs it the same way).
from orchestrator._cli import cli
from orchestrator.testing import FakeModel, tool_call
from stores import FileStore, PostgresStore, SQLiteStore, decode_entry
from tests.cli.team import (
    DEEP,
    NOTES,
    QUESTION,
    build,
    build_solo,
    deciding_model,
    deep_json,
    record,
    save_chain,
)
from tests.postgres import fresh_schema

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, columns: int = 250) -> Result:
    """The command line run in-process, wide enough that no line wraps."""
    runner = CliRunner(env={"COLUMNS": str(columns)})
    return runner.invoke(cli, list(args), catch_exceptions=False)


def as_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def assert_trouble(result: Result, *parts: str) -> None:
    """Exit code 2 and one line on stderr holding each of `parts`, no traceback."""
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("orchestrator: error: ")
    for part in parts:
        assert part in lines[0]


class Recorded:
    """A store the team ran in, as the command line names it, and the lead's State."""

    def __init__(self, target: str, lead: State, store: Any) -> None:
        self.target = target
        self.lead = lead
        self.store = store
        self.children = [
            child
            for entry in lead.history
            if entry.kind == "tool_result"
            for child in entry.child_ids
        ]


def open_store(target: Path) -> Any:
    return SQLiteStore(target) if target.suffix == ".db" else FileStore(target)


@pytest.fixture(params=["file", "sqlite"])
def recorded(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Recorded]:
    target = tmp_path / ("runs.db" if request.param == "sqlite" else "runs")
    store = open_store(target)
    lead = anyio.run(record, store)
    yield Recorded(str(target), lead, store)
    close = getattr(store, "close", None)
    if close is not None:
        close()


# -- runs ---------------------------------------------------------------------------------------


def test_runs_lists_each_state_with_its_agent_status_usage_and_cost(recorded: Recorded) -> None:
    result = run("runs", recorded.target)

    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "id", "agent", "status", "turn", "tokens", "cost", "updated", "title"
    ]  # fmt: skip
    rows = {line.split()[0]: line for line in lines[1:]}
    lead = rows[recorded.lead.id[:12]]
    assert lead.split()[1:6] == ["lead", "answered", "2", "2,800→700", "$0.0210"]
    assert lead.endswith(QUESTION)
    for child in recorded.children:
        assert rows[child[:12]].split()[1:6] == [
            "researcher",
            "answered",
            "2",
            "700→175",
            "$0.0030",
        ]
    assert len(rows) == 3


def test_runs_json_gives_every_field_of_each_state(recorded: Recorded) -> None:
    listed = as_json(run("runs", recorded.target, "--json"))

    by_id = {item["id"]: item for item in listed}
    assert set(by_id) == {recorded.lead.id, *recorded.children}
    lead = by_id[recorded.lead.id]
    assert lead["agent"] == "lead"
    assert lead["status"] == "answered"
    assert lead["stopped"] == {"kind": "until", "name": "waiting_for_user"}
    assert lead["usage"]["cost"] == pytest.approx(0.021)
    assert lead["usage"]["requests"] == 6
    assert lead["title"] == QUESTION
    assert lead["entries"] == len(recorded.lead.history)
    assert lead["parent_id"] is None
    assert {by_id[child]["parent_id"] for child in recorded.children} == {recorded.lead.id}
    assert [item["updated_at"] for item in listed] == sorted(
        (item["updated_at"] for item in listed), reverse=True
    )


def ids(result: Result) -> set[str]:
    return {item["id"] for item in as_json(result)}


def test_runs_filters(recorded: Recorded) -> None:
    everything = {recorded.lead.id, *recorded.children}
    target, lead = recorded.target, recorded.lead.id
    assert ids(run("runs", target, "--json", "--parent", lead[:8])) == set(recorded.children)
    assert ids(run("runs", target, "--json", "--roots")) == {lead}
    assert ids(run("runs", target, "--json", "--agent", "researcher")) == set(recorded.children)
    assert ids(run("runs", target, "--json", "--agent", "nobody")) == set()
    assert ids(run("runs", target, "--json", "--stopped", "until")) == everything
    assert ids(run("runs", target, "--json", "--stopped", "any")) == everything
    assert ids(run("runs", target, "--json", "--stopped", "none")) == set()
    assert ids(run("runs", target, "--json", "--stopped", "limit")) == set()
    assert ids(run("runs", target, "--json", "--since", "1h")) == everything
    assert ids(run("runs", target, "--json", "--since", "2999-01-01")) == set()
    assert ids(run("runs", target, "--json", "--since", "2000-01-01T00:00+00:00")) == everything
    assert len(ids(run("runs", target, "--json", "--limit", "1"))) == 1
    assert ids(run("runs", target, "--json", "--limit", "0")) == everything


def test_runs_says_when_rows_are_left_out_or_none_match(recorded: Recorded) -> None:
    result = run("runs", recorded.target, "--limit", "2")
    assert result.stdout.splitlines()[-1] == "2 of 3 States shown: --limit 3 shows all."

    assert run("runs", recorded.target, "--agent", "nobody").stdout == "No States match.\n"


def test_runs_refuses_a_time_it_cannot_read(recorded: Recorded) -> None:
    result = run("runs", recorded.target, "--since", "yesterday")

    assert result.exit_code == 2
    assert "'yesterday' is not a time" in result.stderr


# -- show ---------------------------------------------------------------------------------------


def test_show_says_how_many_output_tokens_were_reasoning(tmp_path: Path) -> None:
    thought = Reply(
        Message.assistant("42"),
        Usage(input_tokens=120, output_tokens=1_300, requests=1, reasoning_tokens=1_250),
    )
    path = tmp_path / "runs.db"
    state = State(messages=[Message.user("The answer?")])
    with SQLiteStore(path) as store:
        Agent(FakeModel([thought]), store=store).run(state)

    result = run("show", str(path), state.id)

    assert result.exit_code == 0, result.output
    lines = [" ".join(line.split()) for line in result.stdout.splitlines()]
    assert (
        "usage 120 in, 1,300 out tokens (1,250 reasoning); 1 requests; cost - (subagents included)"
        in lines
    )


def test_show_draws_the_conversation_calls_results_usage_timings_and_stop(
    recorded: Recorded,
) -> None:
    result = run("show", recorded.target, recorded.lead.id)

    assert result.exit_code == 0
    out = result.stdout
    lines = [" ".join(line.split()) for line in out.splitlines()]
    assert f"state {recorded.lead.id}" in lines
    assert "agent lead model fake, 1 run" in lines
    assert "status answered at turn 2" in lines
    assert "stop answered" in lines
    assert "usage 2,800 in, 700 out tokens; 6 requests; cost $0.0210 (subagents included)" in lines
    assert f"answer {recorded.lead.answer}" in lines
    assert "Model requests" in lines
    assert "History" in lines
    # the conversation, each call and its result, and the subagents they started
    assert any(line.endswith(f"messages user: {QUESTION}") for line in lines)
    assert sum('call researcher({"task": ' in line for line in lines) == 2
    for child in recorded.children:
        assert f"subagents {child} (700→175 tok, $0.0030)" in out
    for note in NOTES.values():
        assert any(note in line for line in lines)
    assert any("500→125 tok, $0.0050; stop reason tool_use" in line for line in lines)
    assert any("900→225 tok, $0.0100; stop reason end_turn" in line for line in lines)
    request_rows = [line.split() for line in lines if line.startswith(("1 fake", "2 fake"))]
    assert [row[-1] for row in request_rows] == ["tool_use", "end_turn"]
    # what the model was told, once: the instructions, the tools
    (prompt,) = [i for i, line in enumerate(lines) if " prompt [" in line]
    assert lines[prompt].endswith("] Split the question.")
    assert lines[prompt + 1].endswith("tools: researcher")


def test_show_json_holds_the_facts_calls_timings_and_history(recorded: Recorded) -> None:
    shown = as_json(run("show", recorded.target, recorded.lead.id[:10], "--json"))

    lead = recorded.lead
    assert shown["id"] == lead.id
    assert (shown["agent"], shown["model"], shown["tools"]) == ("lead", "fake", ["researcher"])
    assert (shown["status"], shown["turn"], shown["runs"]) == ("answered", 2, 1)
    assert shown["answer"] == lead.answer
    assert shown["usage"]["cost"] == pytest.approx(0.021)
    assert shown["seconds"] >= 0
    assert [call["stop_reason"] for call in shown["model_calls"]] == ["tool_use", "end_turn"]
    assert all(call["seconds"] >= 0 for call in shown["model_calls"])
    assert [call["messages"] for call in shown["model_calls"]] == [1, 3]
    tools = shown["tool_calls"]
    assert [tool["name"] for tool in tools] == ["researcher", "researcher"]
    assert {tool["args"]["task"] for tool in tools} == {"retries", "idempotency"}
    assert all(tool["outcome"] == "done" and tool["seconds"] >= 0 for tool in tools)
    assert sorted(child for tool in tools for child in tool["children"]) == sorted(
        recorded.children
    )
    assert sorted(shown["children"]) == sorted(recorded.children)
    assert [entry["kind"] for entry in shown["history"]] == [e.kind for e in lead.history]
    assert shown["history"][0]["content"]["messages"][0]["content"][0]["text"] == QUESTION


def test_show_a_subagent_names_its_parent_and_call(recorded: Recorded) -> None:
    child = recorded.children[0]
    call = next(
        entry.call.id for entry in recorded.lead.history
        if entry.kind == "tool_result" and child in entry.child_ids
    )  # fmt: skip

    lines = [
        " ".join(line.split()) for line in run("show", recorded.target, child).stdout.splitlines()
    ]

    assert f"parent {recorded.lead.id} (call {call})" in lines
    assert any(
        line.endswith(f"run start agent researcher, model fake; tools: search; started by call"
                      f" {call} of {recorded.lead.id}")
        for line in lines
    )  # fmt: skip


def test_show_an_imported_conversation(tmp_path: Path) -> None:
    from orchestrator import Image, TextBlock, ToolResultBlock

    png = Image(b"\x89PNG....", "image/png")
    messages = [
        Message.user("Look at this", png),
        Message.assistant("Reading it.", [tool_call("read", path="a.txt")]),
        Message("user", (ToolResultBlock("call_1", (TextBlock("the file's text"),)),)),
    ]
    with SQLiteStore(tmp_path / "runs.db") as store:
        state = State(messages=messages)
        store.save(state)

    lines = [
        " ".join(line.split())
        for line in run("show", str(tmp_path / "runs.db"), state.id).stdout.splitlines()
    ]

    start = next(i for i, line in enumerate(lines) if line.split()[1:2] == ["messages"])
    assert lines[start].endswith("messages user: Look at this")
    assert lines[start + 1 : start + 5] == [
        "(image block)",
        "assistant: Reading it.",
        'call read({"path": "a.txt"}) [call_' + lines[start + 3].split("[call_")[1],
        "user: result of call_1: the file's text",
    ]


def test_show_cuts_long_texts_unless_full(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "runs.db") as store:
        state = State(messages=[Message.user("y" * 400)])
        store.save(state)

    cut = run("show", str(tmp_path / "runs.db"), state.id, columns=1000).stdout
    assert "y" * 300 + "… (100 more characters; --full shows all)" in cut
    assert "y" * 301 not in cut
    full = run("show", str(tmp_path / "runs.db"), state.id, "--full", columns=1000).stdout
    assert "y" * 400 in full


def test_show_a_state_with_every_kind_of_entry(tmp_path: Path) -> None:
    """A State that was compacted, asked, restored, given data and notices shows each entry."""
    from orchestrator import Agent

    with SQLiteStore(tmp_path / "runs.db") as store:
        model = FakeModel(["The summary.", "42", "Hello!", [tool_call("nothing")], "done"])
        agent = Agent(model, store=store, name="every")
        state = State(messages=[Message.user("start")], extra_data={"k": 1})
        before = state.snapshot()
        state.add_message(Message.notice("a note"))
        agent.compact(state)
        assert agent.ask(state, "The answer?", int) == 42
        state.restore(before)
        with state.edit_extra_data() as data:
            data["k"] = 2
            data["new"] = [1]
        agent.run(state)
        state.add_message(Message.user("Go on."))
        agent.run(state)  # the second run: a call to a tool the agent lacks, then "done"
        state.clear_tool_results(keep_last=0)
        store.save(state)

    result = run("show", str(tmp_path / "runs.db"), state.id)

    assert result.exit_code == 0
    lines = [" ".join(line.split()) for line in result.stdout.splitlines()]
    history = lines[lines.index("History") + 1 :]
    whats = [line.split()[1] for line in history if line.startswith("+")]
    # The compaction's request records the prompt; the ask and the runs send the same one.
    assert whats[:7] == ["messages", "data", "notice", "prompt", "compacted", "ask", "restored"]
    assert whats.count("prompt") == 1
    happened = lines[lines.index("What happened") + 1 : lines.index("History")]
    assert any(line.split()[1:3] == ["resumed", "run"] for line in happened)
    assert "cleared" in whats
    assert "error" not in whats
    assert any("data k = 1" in line for line in lines)
    assert any("compacted The summary." in line for line in lines)
    assert any("ask The answer? → 42" in line for line in lines)
    assert any("restored went back to entry 2" in line for line in lines)
    assert any("cleared tool results cleared, the last 0 kept" in line for line in lines)
    assert any("data k = 2; new = [1]" in line for line in lines)
    assert any("nothing [call_" in line and " error in " in line for line in lines)
    assert "agent every model fake, 2 runs" in lines


def test_show_renders_approvals_with_who_decided_why_and_which_call(tmp_path: Path) -> None:
    from orchestrator import Agent, approve, awaiting, deny, tool
    from orchestrator.permissions import ApproveLater

    @tool
    def send(to: str) -> str:
        """Send a mail.

        Args:
            to: Who gets it.
        """
        return f"sent to {to}"

    with SQLiteStore(tmp_path / "runs.db") as store:
        model = FakeModel([[tool_call("send", to="bob"), tool_call("send", to="eve")], "done"])
        agent = Agent(model, tools=[send], store=store, permissions=[ApproveLater("send")])
        state = State(messages=[Message.user("Mail them.")])
        agent.run(state)
        to_bob, to_eve = (item.call.id for item in awaiting(state))
        approve(state, to_bob, by="ann", reason="bob asked for it")
        deny(state, to_eve)
        agent.run(state)

    result = run("show", str(tmp_path / "runs.db"), state.id)

    assert result.exit_code == 0
    lines = [" ".join(line.split()) for line in result.stdout.splitlines()]
    approvals = [line.split(" ", 1)[1] for line in lines if line.split()[1:2] == ["approval"]]
    assert approvals == [
        f"approval approved call send [{to_bob}] by ann: bob asked for it",
        f"approval denied call send [{to_eve}]",
    ]
    assert "ApprovalEntry(" not in result.stdout
    assert "ApprovalRecord(" not in result.stdout
    happened = lines[lines.index("What happened") + 1 : lines.index("Model requests")]
    waited = [line.split(" ", 2)[2] for line in happened if line.split()[1:2] == ["waited"]]
    assert [line.split(": ")[0] for line in waited] == [to_bob, to_eve]
    assert "approved by ann after " in waited[0]
    assert "denied after " in waited[1]
    assert any("stopped waiting for approval of send" in line for line in happened)


# -- tree ---------------------------------------------------------------------------------------


def test_tree_draws_each_subagent_under_its_call(recorded: Recorded) -> None:
    result = run("tree", recorded.target, recorded.lead.id)

    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0] == (
        f"lead {recorded.lead.id[:12]} answered · turn 2 · 2,800→700 tok · 6 req · $0.0210"
    )
    calls = {
        entry.call.id: entry.child_ids[0]
        for entry in recorded.lead.history
        if entry.kind == "tool_result"
    }
    branches = lines[1:]
    assert len(branches) == 2
    assert branches[0].startswith("├── ")
    assert branches[1].startswith("└── ")
    for line in branches:
        call, child = next((call, child) for call, child in calls.items() if call in line)
        assert line[4:] == (
            f"researcher {child[:12]} answered · turn 2 · 700→175 tok · 2 req · $0.0030"
            f"  ← researcher {call}"
        )


def test_tree_json_nests_the_children_with_their_calls(recorded: Recorded) -> None:
    tree = as_json(run("tree", recorded.target, recorded.lead.id, "--json"))

    assert (tree["id"], tree["agent"], tree["status"], tree["call"]) == (
        recorded.lead.id, "lead", "answered", None
    )  # fmt: skip
    assert tree["usage"]["cost"] == pytest.approx(0.021)
    children = tree["children"]
    assert sorted(child["id"] for child in children) == sorted(recorded.children)
    for child in children:
        assert child["agent"] == "researcher"
        assert child["call"]["name"] == "researcher"
        assert child["call"]["id"] == child["parent_call_id"]
        assert child["children"] == []
        assert child["usage"]["cost"] == pytest.approx(0.003)


# -- export -------------------------------------------------------------------------------------


def test_tree_of_a_chain_deeper_than_the_recursion_limit(tmp_path: Path) -> None:
    save_chain(tmp_path / "runs.db")

    result = run("tree", str(tmp_path / "runs.db"), "c0")

    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("lead c0 open")
    assert [line.split("── ")[1].split()[0] for line in lines[1:13]] == ["(unnamed"] * 12
    assert lines[13].split("── ")[1].startswith("level 13: (unnamed agent) c13 ")
    assert lines[-1].split("── ")[1].startswith(f"level {DEEP - 1}: (unnamed agent) c{DEEP - 1} ")
    assert len([line for line in lines if "(unnamed agent) c" in line]) == DEEP - 1
    assert all(len(line) <= 250 for line in lines)

    node = deep_json(as_json_text(run("tree", str(tmp_path / "runs.db"), "c0", "--json")))
    for depth in range(1, DEEP):
        (node,) = node["children"]
        assert (node["id"], node["call"]) == (
            f"c{depth}",
            {"id": f"to-c{depth}", "name": "delegate"},
        )
    assert node["children"] == []


def test_json_text_is_what_json_dumps_writes(recorded: Recorded) -> None:
    # Private: the CLI's JSON writer, which writes the deep tree above without recursion.
    from orchestrator._viewing._jsontext import dumps
    from orchestrator._viewing._views import state_data

    data: dict[str, Any] = {
        **state_data(recorded.lead),
        "empty": {},
        "none": [],
        "text": "é [x] \n",
    }
    assert dumps(data, indent=2) == json.dumps(data, ensure_ascii=False, indent=2)
    assert dumps(data) == json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    deep: Any = []
    for _ in range(DEEP):
        deep = [{"n": deep}]
    compact = '[{"n":' * DEEP + "[]" + "}]" * DEEP
    assert dumps(deep) == compact
    assert dumps(deep_json(dumps(deep, indent=2))) == compact  # the same value, indented
    assert max(len(line) for line in dumps(deep, indent=2).splitlines()) < 100  # capped


def as_json_text(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout


def test_export_prints_the_stored_entries_as_json_lines(recorded: Recorded) -> None:
    result = run("export", recorded.target, recorded.lead.id)

    assert result.exit_code == 0
    lines = result.stdout_bytes.splitlines()
    entries = [
        decode_entry(line, state_id=recorded.lead.id, index=index)
        for index, line in enumerate(lines)
    ]
    loaded = recorded.store.load(recorded.lead.id)
    assert tuple(entries) == loaded.history
    assert run("export", recorded.target, recorded.lead.id, "--json").stdout == result.stdout
    assert State(history=entries).snapshot() == State(history=loaded.history).snapshot()


# -- errors -------------------------------------------------------------------------------------


def test_a_missing_id_is_one_line_and_exit_2(recorded: Recorded) -> None:
    for command in ("show", "tree", "export"):
        assert_trouble(
            run(command, recorded.target, "feedface"),
            f"No State 'feedface' in {recorded.target}",
            f"`orchestrator runs {recorded.target}` lists the ids",
        )
    assert_trouble(run("runs", recorded.target, "--parent", "feedface"), "No State 'feedface'")
    assert_trouble(run("show", recorded.target, ""), "The State id is empty")
    assert_trouble(run("show", recorded.target, "../up"), "is not valid")


def test_an_id_start_that_fits_several_states_is_refused(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "runs.db") as store:
        for state_id in ("abc1", "abc2", "abd3"):
            store.save(State(id=state_id, messages=[Message.user("hi")]))

    assert_trouble(
        run("show", str(tmp_path / "runs.db"), "ab"), "'ab' starts 3 State ids", "give more of it"
    )
    assert as_json(run("show", str(tmp_path / "runs.db"), "abd", "--json"))["id"] == "abd3"


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("foo://runs", "open_store cannot open 'foo://runs': unknown scheme 'foo:'"),
        ("sqlite://elsewhere/runs.db", "'sqlite://elsewhere/runs.db' names no file"),
        ("sqlite:runs.db", "'sqlite:runs.db' names no file: write sqlite:///runs.db"),
        ("file://", "'file://' names no local folder"),
        ("memory:x", "unknown scheme 'memory:'"),
        ("sqlite:///missing.db", "No store at 'sqlite:///missing.db'"),
        ("file:///nowhere/at/all", "No store at 'file:///nowhere/at/all'"),
        ("missing.db", "No store at 'missing.db'"),
    ],
)
def test_a_bad_store_url_or_path_is_one_line_and_exit_2(
    target: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert_trouble(run("runs", target), message)
    assert not (tmp_path / "missing.db").exists()  # reading never creates a store


def test_store_urls_open_their_backends(
    recorded: Recorded, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = Path(recorded.target)
    monkeypatch.chdir(path.parent)
    url = f"sqlite:///{path.name}" if path.suffix == ".db" else f"file://{path}"
    assert ids(run("runs", url, "--json")) == {recorded.lead.id, *recorded.children}
    if path.suffix == ".db":
        assert ids(run("runs", f"sqlite:///{path}", "--json")) == ids(run("runs", url, "--json"))
    assert run("runs", "memory:").stdout == "No States match.\n"


def test_a_postgresql_url_reads_a_postgres_store() -> None:
    with fresh_schema("cli") as (dsn, schema):
        with PostgresStore(dsn, schema=schema) as store:
            lead = anyio.run(record, store)
        url = f"{dsn}?schema={schema}"

        listed = ids(run("runs", url, "--json"))
        tree = as_json(run("tree", url, lead.id, "--json"))

    children = {c for e in lead.history if e.kind == "tool_result" for c in e.child_ids}
    assert listed == {lead.id, *children}
    assert {child["id"] for child in tree["children"]} == children


def test_a_file_that_is_no_store_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")

    assert_trouble(run("runs", str(tmp_path / "notes.txt")), "is a file, but not an SQLite store")


def test_a_folder_that_is_no_store_is_refused(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "README.md").write_text("hello")

    for command in (["runs"], ["runs", "--json"], ["show"], ["tree"], ["view"]):
        args = [command[0], str(project), *(["abc"] if command[0] in ("show", "tree") else [])]
        assert_trouble(run(*args, *command[1:]), "is a folder, but not a FileStore")
    assert_trouble(run("runs", project.as_uri()), "is a folder, but not a FileStore")
    assert sorted(path.name for path in project.iterdir()) == ["README.md", "src"]
    (tmp_path / "empty").mkdir()  # a store with nothing saved yet, or everything deleted
    assert run("runs", str(tmp_path / "empty")).stdout == "No States match.\n"


def test_a_damaged_sqlite_store_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "runs.db").write_bytes(b"this is not a database" * 100)

    assert_trouble(run("runs", str(tmp_path / "runs.db")), "is damaged (file is not a database)")
    assert_trouble(run("show", str(tmp_path / "runs.db"), "abc"), "is damaged")


def test_a_damaged_state_in_a_file_store(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "runs")
    lead = anyio.run(record, store)
    child = next(
        c for entry in lead.history if entry.kind == "tool_result" for c in entry.child_ids
    )
    log = tmp_path / "runs" / child / "log.jsonl"
    log.write_bytes(
        log.read_bytes()
        .replace(b'"retries"', b'"retries!"', 1)
        .replace(b'"idempotency"', b'"idempotency!"', 1)
    )
    target = str(tmp_path / "runs")

    assert_trouble(run("show", target, child), f"State '{child}' is damaged")
    assert_trouble(run("export", target, child), f"State '{child}' is damaged")
    assert_trouble(run("replay", target, lead.id, "--agents", "tests.cli.team:build"), "damaged")
    # The others still show, and the tree marks the damaged one.
    assert run("show", target, lead.id).exit_code == 0
    tree = run("tree", target, lead.id)
    assert tree.exit_code == 0
    damaged = [line for line in tree.stdout.splitlines() if line[4:].startswith("(unnamed")]
    assert len(damaged) == 1
    assert f" {child[:12]} damaged · " in damaged[0]
    assert f"State '{child}' is damaged" in tree.stdout
    data = as_json(run("tree", target, lead.id, "--json"))
    (node,) = [node for node in data["children"] if node["id"] == child]
    assert node["status"] == "damaged"
    assert "is damaged" in node["damage"]


def test_runs_lists_a_state_whose_history_is_damaged_without_its_agent(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "runs")
    lead = anyio.run(record, store)
    log = tmp_path / "runs" / lead.id / "log.jsonl"
    log.write_bytes(log.read_bytes().replace(QUESTION.encode(), b"Why are refunds paid thrice?"))

    listed = as_json(run("runs", str(tmp_path / "runs"), "--json"))

    (item,) = [item for item in listed if item["id"] == lead.id]
    assert (item["status"], item["agent"]) == ("answered", None)  # its info is whole
    assert {item["agent"] for item in listed if item["id"] != lead.id} == {"researcher"}


def test_a_damaged_info_shows_in_runs(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "runs")
    lead = anyio.run(record, store)
    (tmp_path / "runs" / lead.id / "info.json").write_text("{")

    listed = as_json(run("runs", str(tmp_path / "runs"), "--json"))
    (item,) = [item for item in listed if item["id"] == lead.id]
    assert item["status"] == "damaged"
    assert item["agent"] is None
    text = run("runs", str(tmp_path / "runs"))
    (line,) = [line for line in text.stdout.splitlines() if line.startswith(lead.id[:12])]
    assert line.split()[1:3] == ["-", "damaged"]
    assert "info.json cannot be read" in line
    tree = run("tree", str(tmp_path / "runs"), lead.id)
    assert "damaged" in tree.stdout.splitlines()[0]


def test_status_words() -> None:
    from orchestrator import (
        AwaitingCall,
        StoppedByApproval,
        StoppedByFinish,
        StoppedByLimit,
        StoppedByPermission,
        StoppedByUntil,
    )
    from orchestrator._viewing._views import status  # private: the view under test

    call = tool_call("rm", path="/")
    assert status(None, False) == "open"
    assert status(None, True) == "finished"
    assert status(StoppedByFinish(), False) == "finished"
    assert status(StoppedByUntil("waiting_for_user"), False) == "answered"
    assert status(StoppedByUntil("budget_spent"), False) == "stopped by budget_spent"
    assert status(StoppedByLimit(50), False) == "turn limit (50)"
    assert status(StoppedByPermission(call, "deny_rm"), False) == "denied by deny_rm"
    waiting = StoppedByApproval((AwaitingCall("s1", call, "needs a person"),))
    assert status(waiting, False) == "waiting for approval"
    assert str(waiting).startswith("waiting for approval")
    assert status(StoppedByLimit(50), False, damage="bad") == "damaged"


@pytest.mark.parametrize("command", [[], ["runs"], ["show"], ["tree"], ["export"], ["replay"]])
def test_every_command_has_help(command: list[str]) -> None:
    result = run(*command, "--help")

    assert result.exit_code == 0
    assert result.stdout.startswith(f"Usage: cli {' '.join(command)}".rstrip() + " ")
    assert "--help" in result.stdout
    if command:
        assert "STORE is a URL" in result.stdout
        assert "--json" in result.stdout


# -- replay -------------------------------------------------------------------------------------


@pytest.fixture
def in_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from the repository's root, where ``tests.cli.team`` is found."""
    monkeypatch.chdir(ROOT)


@pytest.mark.usefixtures("in_root")
def test_replay_of_a_recorded_tree_matches(recorded: Recorded) -> None:
    result = run("replay", recorded.target, recorded.lead.id, "--agents", "tests.cli.team:build")

    assert result.exit_code == 0, result.output
    assert result.stdout == (
        "matched: 6 requests of 3 States answered from the recording (1 run of agent 'lead')\n"
    )
    data = as_json(
        run(
            "replay",
            recorded.target,
            recorded.lead.id,
            "--agents",
            "tests.cli.team:build",
            "--json",
        )
    )
    assert data == {
        "matched": True, "difference": None, "requests": 6, "states": 3, "runs": 1,
        "agent": "lead",
    }  # fmt: skip


@pytest.mark.usefixtures("in_root")
def test_replay_with_a_changed_tool_shows_the_first_difference(recorded: Recorded) -> None:
    args = ("replay", recorded.target, recorded.lead.id, "--agents", "tests.cli.team:build_changed")
    result = run(*args)

    assert result.exit_code == 1
    first, difference = result.stdout.splitlines()
    assert first == "did not match"
    assert "(agent 'researcher'): message 2 differs." in difference
    assert "Got: 'NO IDEMPOTENCY" in difference or "Got: 'REFUND() RETRIES" in difference
    data = json.loads(run(*args, "--json").stdout)
    assert data["matched"] is False
    assert "(agent 'researcher'): message 2 differs." in data["difference"]


@pytest.mark.usefixtures("in_root")
def test_replay_with_changed_instructions_shows_a_diff(recorded: Recorded) -> None:
    args = (
        "replay",
        recorded.target,
        recorded.lead.id,
        "--agents",
        "tests.cli.team:build_instructed",
    )
    result = run(*args)

    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0] == "did not match"
    assert lines[1].endswith(
        f"request 1 of 2 of State {recorded.lead.id} (agent 'lead'): the instructions differ:"
    )
    assert lines[-2:] == ["-Split the question.", "+Split the question in two."]


@pytest.mark.usefixtures("in_root")
def test_replay_compares_the_options_given(recorded: Recorded) -> None:
    args = ("replay", recorded.target, recorded.lead.id, "--agents", "tests.cli.team:build")
    # The recording's model told no options: none given compares none, {} is the same.
    assert run(*args, "--options", "{}").exit_code == 0
    result = run(*args, "--options", '{"temperature": 0.2}')

    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0] == "did not match"
    assert lines[1].endswith(
        f"request 1 of 2 of State {recorded.lead.id} (agent 'lead'): the options differ:"
    )
    assert '+ "temperature": 0.2' in lines
    data = json.loads(run(*args, "--options", '{"temperature": 0.2}', "--json").stdout)
    assert data["matched"] is False
    assert "the options differ" in data["difference"]


@pytest.mark.parametrize("options", ["{not json", "[1, 2]", '"warm"'])
def test_replay_with_bad_options_says_what_to_give(recorded: Recorded, options: str) -> None:
    args = ("replay", recorded.target, recorded.lead.id, "--agents", "tests.cli.team:build")
    result = run(*args, "--options", options)

    assert result.exit_code == 2
    assert "is not a JSON object" in result.output
    assert """e.g. '{"temperature": 0.2}'""" in result.output


@pytest.mark.usefixtures("in_root")
def test_replay_of_the_lead_run_by_another_agent_differs(recorded: Recorded) -> None:
    result = run(
        "replay", recorded.target, recorded.lead.id, "--agents", "tests.cli.team:build",
        "--agent", "researcher",
    )  # fmt: skip

    assert result.exit_code == 1
    assert "the tools differ. Expected: researcher. Got: search." in result.stdout


@pytest.mark.usefixtures("in_root")
def test_replay_of_several_runs_and_a_failed_run(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "runs.db") as store:
        lead = build(deciding_model())["lead"].copy(store=store)
        state = State(messages=[Message.user(QUESTION)])
        lead.run(state)
        state.add_message(Message.user("Look again."))
        lead.run(state)
        from orchestrator import RateLimitError

        failing = build(FakeModel([RateLimitError("slow down")]))["lead"].copy(store=store)
        failed = State(messages=[Message.user(QUESTION)])
        with pytest.raises(RateLimitError):
            failing.run(failed)

    target = str(tmp_path / "runs.db")
    shown = run("show", target, failed.id).stdout.splitlines()
    assert any(line.split()[1:] == ["error", "RateLimitError:", "slow", "down"] for line in shown)
    request_row = next(line.split() for line in shown if line.split()[:2] == ["1", "fake"])
    assert request_row[-3:] == ["-", "-", "error"]
    again = as_json(run("replay", target, state.id, "--agents", "tests.cli.team:build", "--json"))
    assert (again["matched"], again["runs"], again["requests"], again["states"]) == (
        True, 2, 12, 5
    )  # fmt: skip
    # The recorded run failed on its first request: the replay fails the same way.
    assert as_json(run("replay", target, failed.id, "--agents", "tests.cli.team:build", "--json"))[
        "matched"
    ]


@pytest.mark.usefixtures("in_root")
def test_replay_that_raises_or_ends_otherwise_does_not_match(recorded: Recorded) -> None:
    broken = run(
        "replay", recorded.target, recorded.lead.id, "--agents", "tests.cli.team:build_broken"
    )
    assert broken.exit_code == 1
    assert (
        "The replay raised 'RuntimeError: broken loop', which the recorded run did not."
        in broken.stdout
    )

    solo = State(messages=[Message.user("retries")])
    build_solo(FakeModel([tool_call("search", query="retries")]))["solo"].copy(
        store=recorded.store
    ).run(solo)
    same = run("replay", recorded.target, solo.id, "--agents", "tests.cli.team:build_solo")
    assert same.exit_code == 0, same.output
    # The search result comes after the last request: only the final messages show it.
    changed = run(
        "replay", recorded.target, solo.id, "--agents", "tests.cli.team:build_solo_changed"
    )
    assert changed.exit_code == 1
    assert (
        f"After the replay, the messages of State {solo.id} differ: message 2 differs. Its"
        " block 0, the result of call_" in changed.stdout
    )

    short = run(
        "replay", recorded.target, recorded.lead.id, "--agents", "tests.cli.team:build_short"
    )
    assert short.exit_code == 1
    assert (
        f"The replay asked fewer requests than the recording: State {recorded.lead.id} asked 1"
        " of its 2" in short.stdout
    )


@pytest.mark.usefixtures("in_root")
@pytest.mark.parametrize(
    ("agents", "message"),
    [
        ("no-colon", "--agents takes module:function, e.g. myapp.agents:build, got 'no-colon'"),
        ("nowhere_at_all:build", "no module 'nowhere_at_all'"),
        ("tests.cli.team:missing", "module 'tests.cli.team' has no 'missing'"),
        ("tests.cli.team:QUESTION", "'QUESTION' is a str, not a function"),
        ("tests.cli.team:build_nothing", "must return a dict of agent name -> Agent, got list"),
        ("tests.cli.team:build_solo", "has no agent 'lead' (the one that ran the State)"),
    ],
)
def test_replay_with_a_bad_factory_is_one_line_and_exit_2(
    recorded: Recorded, agents: str, message: str
) -> None:
    assert_trouble(run("replay", recorded.target, recorded.lead.id, "--agents", agents), message)


def test_replay_imports_the_factory_from_the_working_folder(
    recorded: Recorded, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "myteam.py").write_text("from tests.cli.team import build\n")
    (folder / "brokenteam.py").write_text("import a_module_nobody_wrote\n")
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(folder))])

    result = run("replay", recorded.target, recorded.lead.id, "--agents", "myteam:build")

    assert result.exit_code == 0, result.output
    assert str(folder) not in sys.path  # put back as it was
    # A module that is there but fails to import shows its own error, with its traceback.
    with pytest.raises(ModuleNotFoundError, match="a_module_nobody_wrote"):
        run("replay", recorded.target, recorded.lead.id, "--agents", "brokenteam:build")


@pytest.mark.usefixtures("in_root")
def test_replay_of_a_state_that_never_ran(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "runs.db") as store:
        unnamed = State(messages=[Message.user("hi")])
        store.save(unnamed)
    target = str(tmp_path / "runs.db")

    assert_trouble(
        run("replay", target, unnamed.id, "--agents", "tests.cli.team:build_solo"),
        "has no run to replay",
    )
    assert_trouble(
        run("replay", target, unnamed.id, "--agents", "tests.cli.team:build"),
        "was run by an unnamed agent: pick one of the factory's with --agent (lead, researcher)",
    )


# -- the real command ---------------------------------------------------------------------------


def command(*args: str, **options: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        **options,
    )


def test_the_console_script_reads_a_store_the_example_wrote(tmp_path: Path) -> None:
    """`examples/parallel_agents.py` writes a store; the installed command reads it."""
    db = tmp_path / "runs.db"
    example = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "parallel_agents.py"), str(db)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "states in the tree: 4" in example.stdout

    listed = command("runs", str(db), "--roots", "--json")
    assert listed.returncode == 0, listed.stderr
    (lead,) = json.loads(listed.stdout)
    assert (lead["agent"], lead["status"]) == ("lead", "answered")

    script = Path(sys.executable).with_name("orchestrator")
    tree = subprocess.run(
        [str(script), "tree", str(db), lead["id"]], capture_output=True, text=True, timeout=60,
        check=False, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert tree.returncode == 0, tree.stderr
    lines = tree.stdout.splitlines()
    assert lines[0].startswith(f"lead {lead['id'][:12]} answered · turn 2 · 3,500→875 tok")
    assert sorted(line.split()[1] for line in lines[1:]) == [
        "code_reader", "log_reader", "test_runner"
    ]  # fmt: skip

    # Not on a terminal and no COLUMNS: 120 columns, so the table keeps each State on a line.
    plain = command("runs", str(db), "--roots", env={
        key: value for key, value in os.environ.items() if key != "COLUMNS"
    })  # fmt: skip
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines()[1].split()[:3] == [lead["id"][:12], "lead", "answered"]
    assert plain.stdout.splitlines()[1].rstrip().endswith("Why are refunds paid twice?")

    missing = command("show", str(db), "feedface")
    assert missing.returncode == 2
    assert missing.stdout == ""
    assert missing.stderr == (
        f"orchestrator: error: No State 'feedface' in {db}: `orchestrator runs {db}` lists the"
        " ids.\n"
    )


def test_a_closed_pipe_ends_the_command_quietly(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "runs.db") as store:
        state = State(messages=[Message.user("z" * 500_000)])
        store.save(state)
    with subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "export", str(tmp_path / "runs.db"), state.id],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as process:
        assert process.stdout is not None
        assert process.stderr is not None
        process.stdout.read(10)
        process.stdout.close()  # like `| head -c 10`
        errors = process.stderr.read()
        process.wait(timeout=60)
    assert errors == b""  # no traceback: click ends the command quietly on a closed pipe


def test_python_dash_m_runs_the_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["orchestrator", "--version"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("orchestrator", run_name="__main__")
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("orchestrator, version ")
