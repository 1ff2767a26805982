"""`orchestrator view` over real HTTP: the page, its JSON, errors, and that it only reads."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner

from orchestrator import State

# Private: the CLI's modules (the viewer server and its entry point), driven directly.
from orchestrator._cli import cli
from orchestrator._viewing._viewer import Viewer, ViewerServer, running
from stores import FileStore, PostgresStore, SQLiteStore
from tests.cli.team import DEEP, deep_json, record, save_chain
from tests.postgres import fresh_schema
from tests.viewer.conftest import ROOT, Research


class Answer:
    """An HTTP response, read whole."""

    def __init__(self, response: http.client.HTTPResponse) -> None:
        self.status = response.status
        self.headers = {name.lower(): value for name, value in response.getheaders()}
        self.body = response.read()

    def json(self) -> Any:
        assert self.headers["content-type"] == "application/json; charset=utf-8"
        return json.loads(self.body)


def fetch(
    server: ViewerServer, path: str, *, method: str = "GET", host: str | None = None
) -> Answer:
    """One request to the viewer, on a connection of its own."""
    # A bound, never a measure: the deep chain takes ~2 s here, and over 10 on a loaded machine.
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        headers = {} if host is None else {"Host": host}
        connection.request(method, path, headers=headers)
        return Answer(connection.getresponse())
    finally:
        connection.close()


def get_json(server: ViewerServer, path: str) -> Any:
    answer = fetch(server, path)
    assert answer.status == 200, answer.body
    return answer.json()


@pytest.fixture
def server(research: Research) -> Iterator[ViewerServer]:
    with SQLiteStore(research.path) as store, running(Viewer(store, "runs.db")) as server:
        yield server


def files_of(path: Path) -> dict[str, str]:
    """A digest of every file under `path` (or of `path` itself)."""
    files = sorted(path.rglob("*")) if path.is_dir() else [path]
    return {
        str(file.relative_to(path.parent)): hashlib.sha256(file.read_bytes()).hexdigest()
        for file in files
        if file.is_file()
    }


# -- the page ------------------------------------------------------------------------------------


def test_the_page_its_script_and_style_are_served(server: ViewerServer) -> None:
    page = fetch(server, "/")
    script = fetch(server, "/static/viewer.js")
    style = fetch(server, "/static/viewer.css")

    assert page.status == script.status == style.status == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert b'<script src="static/viewer.js" defer></script>' in page.body
    assert b'<link rel="stylesheet" href="static/viewer.css">' in page.body
    assert script.headers["content-type"] == "text/javascript; charset=utf-8"
    assert b"async function getJSON(path)" in script.body
    assert style.headers["content-type"] == "text/css; charset=utf-8"
    assert fetch(server, "/index.html").body == page.body


def test_the_page_loads_nothing_from_elsewhere(server: ViewerServer) -> None:
    for path in ("/", "/static/viewer.js", "/static/viewer.css"):
        answer = fetch(server, path)
        # The browser enforces this: scripts, styles and fetches from the viewer only.
        policy = answer.headers["content-security-policy"]
        assert "default-src 'none'" in policy
        assert "script-src 'self'" in policy
        assert "connect-src 'self'" in policy
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert b"http://" not in answer.body
        assert b"https://" not in answer.body
        assert b"//cdn" not in answer.body


def test_head_answers_without_a_body(server: ViewerServer) -> None:
    answer = fetch(server, "/", method="HEAD")

    assert answer.status == 200
    assert int(answer.headers["content-length"]) > 1000
    assert answer.body == b""


# -- the JSON the page reads -----------------------------------------------------------------------


def test_runs_lists_the_run_with_its_agent_status_and_usage(
    server: ViewerServer, research: Research
) -> None:
    data = get_json(server, "/api/runs")

    assert (data["store"], data["states"], data["total"]) == ("runs.db", 4, 1)
    (run,) = data["runs"]
    lead = research.lead
    assert run["id"] == lead.id
    assert (run["agent"], run["status"], run["turn"]) == ("lead", "answered", 2)
    assert run["title"] == lead.messages[0].text
    assert run["usage"]["requests"] == lead.usage.requests == 11  # 2 for the lead, 3 each


def test_runs_takes_a_limit(server: ViewerServer) -> None:
    assert get_json(server, "/api/runs?limit=0")["runs"] != []  # 0: all
    assert fetch(server, "/api/runs?limit=all").status == 422


def test_a_run_has_its_tree(server: ViewerServer, research: Research) -> None:
    tree = get_json(server, f"/api/runs/{research.lead.id}")["tree"]

    assert (tree["id"], tree["agent"], tree["status"]) == (research.lead.id, "lead", "answered")
    children = tree["children"]
    assert sorted(child["id"] for child in children) == sorted(s.id for s in research.researchers)
    for child in children:
        assert child["agent"] == "researcher"
        assert child["call"]["name"] == "research"
        assert child["status"] == "answered"
        assert child["children"] == []


def rows_of(server: ViewerServer, research: Research) -> list[dict[str, Any]]:
    return get_json(server, f"/api/runs/{research.lead.id}")["timeline"]["rows"]


def test_the_timeline_has_a_bar_for_each_state_and_call_in_tree_order(
    server: ViewerServer, research: Research
) -> None:
    rows = rows_of(server, research)

    shape = [(row["kind"], row["depth"], row.get("name") or row.get("agent")) for row in rows]
    researcher = [
        ("state", 2, "researcher"),
        ("call", 3, "search"),
        ("call", 3, "read"),
        ("call", 3, "read"),
    ]
    assert shape == [("state", 0, "lead"), *([("call", 1, "research"), *researcher] * 3)]
    # Each researcher sits under the call that started it.
    for call, child in zip(rows[1::5], rows[2::5], strict=True):
        assert call["children"] == [child["id"]]
        assert child["call"]["id"] == call["id"]


def test_the_timeline_bars_come_from_the_entries_times(
    server: ViewerServer, research: Research
) -> None:
    data = get_json(server, f"/api/runs/{research.lead.id}")["timeline"]
    lead = research.lead
    origin = lead.history[0].at

    def offset(moment: Any) -> float:
        return round((moment - origin).total_seconds(), 6)

    assert data["start"] == origin.isoformat()
    (lead_row,) = [row for row in data["rows"] if row["id"] == lead.id]
    assert (lead_row["start"], lead_row["end"]) == (0.0, offset(lead.history[-1].at))
    assert data["seconds"] == lead_row["end"]
    # A call's bar: from the reply that asked for it to its result.
    (reply,) = [e for e in lead.history if e.kind == "model_reply" and e.tool_calls]
    results = {e.call.id: e for e in lead.history if e.kind == "tool_result"}
    for call in reply.tool_calls:
        (row,) = [row for row in data["rows"] if row["id"] == call.id]
        assert row["start"] == offset(reply.at)
        assert row["end"] == offset(results[call.id].at)
        assert row["outcome"] == "done"
    # A State's model requests: from each request to its reply.
    requests = [e for e in lead.history if e.kind == "model_request"]
    replies = [e for e in lead.history if e.kind == "model_reply"]
    assert [(m["start"], m["end"]) for m in lead_row["model"]] == [
        (offset(q.at), offset(r.at)) for q, r in zip(requests, replies, strict=True)
    ]


def overlap(bars: list[dict[str, Any]]) -> bool:
    """Whether all `bars` were running at one moment."""
    return max(bar["start"] for bar in bars) < min(bar["end"] for bar in bars)


def test_the_timeline_shows_parallel_calls_and_children_overlapping(
    server: ViewerServer, research: Research
) -> None:
    rows = rows_of(server, research)

    researches = [row for row in rows if row.get("name") == "research"]
    assert len(researches) == 3
    assert overlap(researches)  # the three researchers ran at once
    children = [row for row in rows if row.get("agent") == "researcher"]
    assert overlap(children)
    for call, child in zip(researches, children, strict=True):
        assert call["start"] <= child["start"] <= child["end"] <= call["end"]
    for state in children:  # each researcher read two files at once
        reads = [r for r in rows if r.get("name") == "read" and r["state_id"] == state["id"]]
        assert len(reads) == 2
        assert overlap(reads)


def test_a_state_has_its_facts_data_and_messages(server: ViewerServer, research: Research) -> None:
    child = research.researchers[0]

    data = get_json(server, f"/api/states/{child.id}")

    assert (data["id"], data["agent"], data["status"]) == (child.id, "researcher", "answered")
    assert (data["parent_id"], data["run_id"]) == (research.lead.id, research.lead.id)
    assert data["answer"] == child.answer
    findings = data["extra_data"]["findings"]
    assert findings
    assert all(set(f) == {"source", "text"} for f in findings)
    assert data["extra_data"]["sources"] == child.get("sources")
    roles = [message["role"] for message in data["messages"]]
    assert roles == ["user", "assistant", "user", "assistant", "user", "assistant"]
    calls = [b for m in data["messages"] for b in m["blocks"] if b["kind"] == "tool_call"]
    results = [b for m in data["messages"] for b in m["blocks"] if b["kind"] == "tool_result"]
    assert [c["name"] for c in calls] == ["search", "read", "read"]
    assert [r["call_id"] for r in results] == [c["id"] for c in calls]
    assert all(tool["seconds"] is not None for tool in data["tool_calls"])


def test_the_lead_holds_the_researchers_findings(server: ViewerServer, research: Research) -> None:
    data = get_json(server, f"/api/states/{research.lead.id}")

    found = [f["source"] for f in data["extra_data"]["findings"]]
    theirs: set[str] = set()
    for researcher in research.researchers:
        theirs.update(finding["source"] for finding in researcher.get("findings"))
    assert set(found) == theirs
    assert len(found) == len(set(found))  # merged: each line once
    last = data["messages"][-1]
    assert last["role"] == "assistant"
    assert last["blocks"] == [{"kind": "text", "text": research.lead.answer}]


# -- errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "status", "says"),
    [
        ("/api/states/feedface", 404, "No State 'feedface' in runs.db."),
        ("/api/runs/feedface", 404, "No State 'feedface' in runs.db."),
        ("/api/states/bad%20id", 422, "State id"),
        ("/api/states", 404, "Give a State id"),
        ("/api/everything", 404, "Nothing at /api/everything."),
        ("/static/../_viewer.py", 404, "No file '../_viewer.py'."),
        ("/static/secrets.txt", 404, "No file 'secrets.txt'."),
    ],
)
def test_what_is_not_there_is_a_json_error(
    server: ViewerServer, path: str, status: int, says: str
) -> None:
    answer = fetch(server, path)

    assert answer.status == status
    assert says in answer.json()["error"]


def test_a_request_for_another_host_is_refused(server: ViewerServer) -> None:
    # A page elsewhere that points its own host name at 127.0.0.1 (DNS rebinding) gets nothing.
    answer = fetch(server, "/api/runs", host=f"attacker.example:{server.port}")

    assert answer.status == 403
    assert answer.json() == {"error": f"Unknown host 'attacker.example:{server.port}'."}
    assert fetch(server, "/api/runs", host=f"localhost:{server.port}").status == 200


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_nothing_but_get_and_head(server: ViewerServer, method: str) -> None:
    assert fetch(server, "/api/runs", method=method).status == 501


def test_a_damaged_state_is_shown_as_damaged_and_the_rest_still_serves(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "runs")
    lead = anyio.run(record, store)
    child = next(c for e in lead.history if e.kind == "tool_result" for c in e.child_ids)
    log = tmp_path / "runs" / child / "log.jsonl"
    log.write_bytes(log.read_bytes().replace(b'"retries"', b'"retries!"', 1))
    log.write_bytes(log.read_bytes().replace(b'"idempotency"', b'"idempotency!"', 1))

    with running(Viewer(store, "runs")) as server:
        broken = fetch(server, f"/api/states/{child}")
        run = get_json(server, f"/api/runs/{lead.id}")
        assert get_json(server, f"/api/states/{lead.id}")["agent"] == "lead"

    assert broken.status == 422
    assert f"State '{child}' is damaged" in broken.json()["error"]
    (node,) = [node for node in run["tree"]["children"] if node["id"] == child]
    assert node["status"] == "damaged"
    (row,) = [row for row in run["timeline"]["rows"] if row["id"] == child]
    assert (row["status"], row["start"], row["end"]) == ("damaged", None, None)
    assert f"State '{child}' is damaged" in row["damage"]


def test_a_chain_deeper_than_the_recursion_limit_is_served(tmp_path: Path) -> None:
    save_chain(tmp_path / "runs.db")

    with SQLiteStore(tmp_path / "runs.db") as store, running(Viewer(store, "runs.db")) as server:
        run = fetch(server, "/api/runs/c0")
        last = get_json(server, f"/api/states/c{DEEP - 1}")
        (listed,) = get_json(server, "/api/runs")["runs"]

    assert run.status == 200, run.body[:300]
    data = deep_json(run.body.decode())
    rows = data["timeline"]["rows"]
    states = [row for row in rows if row["kind"] == "state"]
    assert [(row["id"], row["depth"]) for row in states] == [(f"c{i}", 2 * i) for i in range(DEEP)]
    assert [row["name"] for row in rows if row["kind"] == "call"] == ["delegate"] * (DEEP - 1)
    node = data["tree"]
    for depth in range(1, DEEP):
        (node,) = node["children"]
        assert node["id"] == f"c{depth}"
    assert (last["run_id"], last["parent_id"]) == ("c0", f"c{DEEP - 2}")
    assert listed["id"] == "c0"


def test_an_unexpected_failure_is_a_500_and_the_viewer_goes_on(research: Research) -> None:
    class Flaky:
        def __init__(self, store: Any) -> None:
            self.store = store
            self.fail = True

        def list(self, **options: Any) -> Any:
            if self.fail:
                self.fail = False
                raise RuntimeError("the disk hiccuped")
            return self.store.list(**options)

        def load(self, state_id: str) -> State:
            return self.store.load(state_id)

    with SQLiteStore(research.path) as store, running(Viewer(Flaky(store), "x")) as server:
        failed = fetch(server, "/api/runs")
        assert get_json(server, "/api/runs")["total"] == 1

    assert failed.status == 500
    assert failed.json() == {"error": "RuntimeError: the disk hiccuped"}


# -- it only reads ---------------------------------------------------------------------------------


def visit_everything(server: ViewerServer) -> None:
    for run in get_json(server, "/api/runs?limit=0")["runs"]:
        tree = get_json(server, f"/api/runs/{run['id']}")
        for row in tree["timeline"]["rows"]:
            if row["kind"] == "state":
                get_json(server, f"/api/states/{row['id']}")
            for method in ("POST", "PUT", "DELETE"):
                fetch(server, f"/api/states/{row['id']}", method=method)


def test_it_never_writes_an_sqlite_store(research: Research) -> None:
    folder = research.path.parent
    before = files_of(folder)

    with SQLiteStore(research.path) as store, running(Viewer(store, "runs.db")) as server:
        visit_everything(server)

    assert files_of(folder) == before


def test_it_never_writes_a_file_store(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "runs")
    anyio.run(record, store)
    before = files_of(tmp_path / "runs")

    with running(Viewer(FileStore(tmp_path / "runs"), "runs")) as server:
        visit_everything(server)

    assert files_of(tmp_path / "runs") == before


def test_a_postgres_store_is_served_and_left_as_it_was() -> None:
    with fresh_schema("viewer") as (dsn, schema), PostgresStore(dsn, schema=schema) as store:
        lead = anyio.run(record, store)
        before = [(info.id, info.entries, info.updated_at) for info in store.list()]
        with running(Viewer(store, "postgres")) as server:
            visit_everything(server)
            run = get_json(server, f"/api/runs/{lead.id}")
        after = [(info.id, info.entries, info.updated_at) for info in store.list()]

    assert after == before
    children = {c for e in lead.history if e.kind == "tool_result" for c in e.child_ids}
    assert {child["id"] for child in run["tree"]["children"]} == children
    assert [row["kind"] for row in run["timeline"]["rows"]].count("state") == 3


# -- the command -----------------------------------------------------------------------------------


def test_view_serves_until_ctrl_c(research: Research) -> None:
    """The installed command prints its address, serves, and stops cleanly on SIGINT."""
    command = Path(sys.executable).with_name("orchestrator")
    process = subprocess.Popen(
        [str(command), "view", str(research.path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        second = process.stdout.readline()  # read here: communicate() skips what readline buffered
        assert first.startswith(f"Serving {research.path} read-only at http://127.0.0.1:")
        url = first.split(" at ")[1].strip()
        port = int(url.removeprefix("http://127.0.0.1:").rstrip("/"))
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("GET", "/api/runs")
        runs = json.loads(connection.getresponse().read())
        connection.close()
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

    assert runs["runs"][0]["id"] == research.lead.id
    assert process.returncode == 0
    assert second == "Press Ctrl+C to stop.\n"
    assert out == "Stopped.\n"
    assert err == ""


def one_line_error(args: list[str]) -> str:
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("orchestrator: error: ")
    return line


def test_view_of_a_missing_or_bad_store_is_one_line_and_exit_2(tmp_path: Path) -> None:
    assert "No store at" in one_line_error(["view", str(tmp_path / "nothing.db")])
    assert "unknown scheme" in one_line_error(["view", "mongodb://db/runs"])
    (tmp_path / "runs.db").write_bytes(b"this is not a database" * 100)
    assert "is damaged (file is not a database)" in one_line_error(
        ["view", str(tmp_path / "runs.db")]
    )


def test_a_store_damaged_while_served_is_an_error_on_the_page(tmp_path: Path) -> None:
    (tmp_path / "runs.db").write_bytes(b"this is not a database" * 100)

    with SQLiteStore(tmp_path / "runs.db") as store, running(Viewer(store, "runs.db")) as server:
        answer = fetch(server, "/api/runs")

    assert answer.status == 422
    assert "is damaged" in answer.json()["error"]


def test_view_on_a_port_in_use_is_one_line_and_exit_2(research: Research) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_line_error(["view", str(research.path), "--port", str(port)])

    assert f"Cannot listen on 127.0.0.1:{port}" in line
    assert "--port 0 for a free one" in line


def test_view_has_help() -> None:
    result = CliRunner().invoke(cli, ["view", "--help"])

    assert result.exit_code == 0
    assert result.stdout.startswith("Usage: cli view [OPTIONS] STORE")
    assert "--port" in result.stdout
    assert "STORE is a URL" in result.stdout


def test_python_dash_m_lists_view() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COLUMNS": "120"},
    )
    assert "view" in done.stdout.split("Commands:")[1]
