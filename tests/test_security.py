"""What SECURITY.md promises that the source itself shows (no code from data, SQL with
parameters), that each test it names exists, and that a store URL's secrets never show.

The other promises (ids, file modes, provider keys, integrity) are proven by the behaviour tests
that SECURITY.md names.
"""

from __future__ import annotations

import ast
import logging
import re
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import pytest
import structlog

from orchestrator import Agent, StoreError
from orchestrator.testing import FakeModel
from stores import PostgresStore, open_store

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = sorted([*(ROOT / "orchestrator").rglob("*.py"), *(ROOT / "stores").rglob("*.py")])
SQL = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|PRAGMA|ALTER|DROP)\b")  # as we write it
# What an SQL f-string may put in its text: constants of the module, and the "?, ?" marks.
SQL_PIECES = {"BUSY_TIMEOUT_MS", "_INFO_COLUMNS", "_NOW", "marks"}
# Modules that turn text into code or objects: none of them is ever used on stored data.
FORBIDDEN_MODULES = {"pickle", "marshal", "shelve", "dill", "cloudpickle"}
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__"}


def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


@pytest.mark.parametrize("path", LIBRARY, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_code_is_made_from_data(path: Path) -> None:
    for node in ast.walk(tree(path)):
        names: set[str] = set()
        if isinstance(node, ast.Import):
            names = {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names = {(node.module or "").split(".")[0]}
        where = f"{path}:{getattr(node, 'lineno', '?')}"
        assert not names & FORBIDDEN_MODULES, f"{where} imports {names}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in FORBIDDEN_CALLS, f"{where} calls {node.func.id}"


@pytest.mark.parametrize("path", LIBRARY, ids=lambda path: str(path.relative_to(ROOT)))
def test_sql_text_never_holds_a_value(path: Path) -> None:
    """Values reach SQLite as parameters: an SQL f-string interpolates only fixed pieces."""
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.JoinedStr):
            text = "".join(
                str(part.value) for part in node.values if isinstance(part, ast.Constant)
            )
            if not SQL.match(text):
                continue
            pieces = {
                ast.unparse(part.value)
                for part in node.values
                if isinstance(part, ast.FormattedValue)
            }
            assert pieces <= SQL_PIECES, f"{path}:{node.lineno} puts {pieces} into SQL text"
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod | ast.Add):
            left = node.left
            if isinstance(left, ast.Constant) and isinstance(left.value, str):
                assert not SQL.match(left.value), f"{path}:{node.lineno} builds SQL with {node.op}"


def test_sql_lives_in_one_module() -> None:
    outside = [
        f"{path}:{node.lineno}"
        for path in LIBRARY
        if path.name not in ("_sql.py", "_postgres_sql.py")  # SQLite's, and PostgreSQL's
        for node in ast.walk(tree(path))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and SQL.match(node.value)
        and re.search(r"\b(FROM|INTO|TABLE|SET)\b", node.value)
    ]
    assert outside == []


def test_the_tests_security_md_names_exist() -> None:
    text = (ROOT / "SECURITY.md").read_text(encoding="utf-8")
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", text)
    assert len(named) >= 10
    for file, name in named:
        source = (ROOT / file).read_text(encoding="utf-8")
        assert re.search(rf"^(async )?def {name}\(|^    (async )?def {name}\(", source, re.M), (
            f"SECURITY.md names {file}::{name}, which does not exist"
        )


# -- a store URL's secrets never show ---------------------------------------------------------

SECRET = "Zq9-s3cret_pw"
# Each form a store's secret can take. The PostgreSQL ones point at port 1 of 127.0.0.1, where
# nothing listens: connecting fails at once, with the password in the DSN.
SECRET_URLS = (
    f"postgresql://app:{SECRET}@127.0.0.1:1/runs",
    f"postgres://app@127.0.0.1:1/runs?sslmode=disable&sslpassword={SECRET}",
    f"host=127.0.0.1 port=1 user=app password={SECRET} dbname=runs",
    f"sqlite://app:{SECRET}@db.internal/runs.db",
    f"sqlite:///runs.db?password={SECRET}",
    f"file://app:{SECRET}@db.internal/var/runs",
    f"file:///var/runs#token={SECRET}",
    f"mysql://app@db.internal/runs?password={SECRET}",
)
# Every command that reads a store, each way it can fail.
COMMANDS = (
    ("runs", "{url}"),
    ("runs", "{url}", "--json"),
    ("runs", "{url}", "--parent", "feedface"),
    ("show", "{url}", "feedface"),
    ("show", "{url}", "feedface", "--json"),
    ("tree", "{url}", "feedface"),
    ("tree", "{url}", "feedface", "--json"),
    ("export", "{url}", "feedface"),
    ("view", "{url}", "--port", "0"),
    ("replay", "{url}", "feedface", "--agents", "tests.cli.team:build"),
)


def described(error: BaseException) -> str:
    """All a person may see of `error`: its traceback, and the text and repr of each cause."""
    seen = ["".join(traceback.format_exception(error))]
    chained: BaseException | None = error
    while chained is not None:
        seen += [str(chained), repr(chained)]
        chained = chained.__cause__ or chained.__context__
    return "\n".join(seen)


def command_output(*args: str) -> str:
    """What the command line prints, both streams, and any exception it let out."""
    from click.testing import CliRunner

    # Private: the CLI's entry point, called in-process (the command runs it the same way).
    from orchestrator._cli import cli

    result = CliRunner().invoke(cli, list(args))
    shown = result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        shown += described(result.exception)
    return shown


def logged(events: Sequence[Mapping[str, Any]], caplog: pytest.LogCaptureFixture) -> list[str]:
    """Every structlog event and standard library log record, as text."""
    return [repr(event) for event in events] + [
        f"{record.getMessage()} {record.args!r} {record.exc_text}" for record in caplog.records
    ]


def ray_job(url: str) -> Any:
    """What RayRunner sends a worker for a child saved in the store at `url`."""
    from orchestrator import Link
    from orchestrator.runners._ray import RayJob  # private: the job, made directly

    link = Link(parent_id="lead", call_id="c1", scope="lead.c1")
    return RayJob(agent="a", link=link, state_id="kid", task="t", store_url=url, deadline=None)


def assert_hidden(seen: list[str]) -> None:
    for text in seen:
        assert SECRET not in text, text


@pytest.mark.parametrize("url", SECRET_URLS)
@pytest.mark.timeout(60)
def test_a_store_urls_secret_is_in_no_error_repr_log_or_command_output(
    url: str, caplog: pytest.LogCaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    with structlog.testing.capture_logs() as events:
        try:
            store = open_store(url)
        except ValueError as error:
            seen.append(described(error))
        else:  # PostgreSQL: made now, refused when it connects
            seen += [repr(store), str(store), repr(ray_job(cast("str", store.url)))]
            with pytest.raises(StoreError) as failed:
                store.list()
            seen.append(described(failed.value))
            with pytest.raises(StoreError) as failed:
                Agent(FakeModel(["Hi."]), store=store).run("Hello")
            seen.append(described(failed.value))
            store.close()
        if url.startswith("host="):
            store = PostgresStore(url)
            seen.append(repr(store))
            with pytest.raises(StoreError) as failed:
                store.list()
            seen.append(described(failed.value))
            store.close()
        for command in COMMANDS:
            output = command_output(*(part.format(url=url) for part in command))
            assert "orchestrator: error: " in output, output
            seen.append(output)
    seen += logged(events, caplog)
    assert any("***" in text for text in seen)
    assert_hidden(seen)
    assert list(tmp_path.iterdir()) == []  # and no file was made with the secret in its name


def viewer_pages(port: int, state_ids: list[str]) -> list[str]:
    """Each page and JSON document the viewer on `port` serves, with its headers."""
    import http.client

    paths = ["/", "/static/viewer.js", "/api/runs", "/api/runs?limit=x", "/api/states"]
    for state_id in [*state_ids, "feedface"]:
        paths += [f"/api/runs/{state_id}", f"/api/states/{state_id}"]
    pages: list[str] = []
    for path in paths:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            body = response.read().decode()
            pages.append(f"{path} {response.status} {response.getheaders()} {body}")
        finally:
            connection.close()
    return pages


@pytest.mark.timeout(120)
def test_a_postgres_stores_password_is_in_no_command_output_page_or_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A store that opens: every command, every page of `orchestrator view`, its logs."""
    import signal
    import subprocess
    import sys

    import anyio

    from tests.cli.team import record
    from tests.postgres import fresh_schema

    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    with fresh_schema("secret") as (dsn, schema), structlog.testing.capture_logs() as events:
        # The test server trusts local connections: the password is sent and never needed.
        url = dsn.replace("postgres@", f"postgres:{SECRET}@", 1)
        url += f"?schema={schema}&sslpassword={SECRET}"
        with open_store(url) as store:
            lead = anyio.run(record, store)
            seen += [repr(store), str(store)]
        ids = [lead.id, *(c for e in lead.history if e.kind == "tool_result" for c in e.child_ids)]
        for command in COMMANDS:
            for state_id in (ids[0][:6], ids[1], "feedface"):
                args = [part.format(url=url).replace("feedface", state_id) for part in command]
                if args[0] != "view":
                    seen.append(command_output(*args))
        process = subprocess.Popen(
            [str(Path(sys.executable).with_name("orchestrator")), "view", url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        try:
            assert process.stdout is not None
            serving = process.stdout.readline()
            seen.append(serving)
            port = int(serving.split(" at http://127.0.0.1:")[1].strip().rstrip("/"))
            seen += viewer_pages(port, ids)
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=10)
            seen += [out, err]
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    seen += logged(events, caplog)
    assert serving.startswith("Serving postgresql://postgres:***@127.0.0.1:")
    assert any('"store":"postgresql://postgres:***@' in page for page in seen)
    assert any(lead.id in page and "/api/runs/" in page for page in seen)
    assert_hidden(seen)


def test_the_viewer_shows_a_store_name_without_its_secrets(tmp_path: Path) -> None:
    from orchestrator import Message, State

    # Private: the viewer's server, driven directly.
    from orchestrator._viewing._viewer import Viewer, running
    from stores import SQLiteStore

    state = State(id="one", messages=[Message.user("hi")])
    name = f"sqlite:///runs.db?token={SECRET}"
    with SQLiteStore(tmp_path / "runs.db") as store:
        store.save(state)
        with running(Viewer(store, name)) as server:
            pages = viewer_pages(server.port, [state.id])
    assert any('"store":"sqlite:///runs.db?token=***"' in page for page in pages)
    assert any("No State 'feedface' in sqlite:///runs.db?token=***." in page for page in pages)
    assert_hidden(pages)
