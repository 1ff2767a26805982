"""`stores.open_store(url)`: each scheme opens its backend; the password is never shown."""

from __future__ import annotations

import logging
import traceback
from pathlib import Path

import pytest

from orchestrator import Message, State, StoreError
from stores import (
    FileStore,
    MemoryStore,
    PostgresStore,
    SQLiteStore,
    open_store,
    redact_url,
    url_secrets,
)
from tests.postgres import fresh_schema

SECRET = "S3cret-pw_91"


def test_memory() -> None:
    store = open_store("memory:")
    assert isinstance(store, MemoryStore)
    store.save(State(id="m"))
    assert store.load("m").id == "m"


@pytest.mark.anyio
async def test_every_local_store_it_opens_closes_in_a_with_block(tmp_path: Path) -> None:
    for url in ("memory:", (tmp_path / "states").as_uri(), f"sqlite:///{tmp_path / 'r.db'}"):
        with open_store(url) as store:
            store.save(State(id="w"))
            assert [info.id for info in store.list()] == ["w"]
        async with open_store(url) as again:
            await again.alist()


def test_file_url_is_an_absolute_folder(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/runs")
    assert isinstance(store, FileStore)
    store.save(State(id="f", messages=[Message.user("hi")]))
    assert (tmp_path / "runs" / "f" / "log.jsonl").exists()


def test_sqlite_url_relative_and_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with open_store("sqlite:///runs.db") as relative:
        assert isinstance(relative, SQLiteStore)
        relative.save(State(id="r"))
    assert (tmp_path / "runs.db").exists()
    with open_store(f"sqlite:///{tmp_path}/abs.db") as absolute:  # four slashes
        absolute.save(State(id="a"))
    assert (tmp_path / "abs.db").exists()


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///", "sqlite:runs.db", "file://host/x"])
def test_a_url_without_its_path_says_how_to_write_it(url: str) -> None:
    with pytest.raises(ValueError, match="names no"):
        open_store(url)


def test_an_unknown_scheme_lists_the_valid_ones_without_the_password() -> None:
    with pytest.raises(ValueError, match="unknown scheme 'mysql:'") as raised:
        open_store(f"mysql://app:{SECRET}@db.internal/runs")
    text = str(raised.value)
    for scheme in ("memory:", "file:///", "sqlite:///", "postgresql://"):
        assert scheme in text
    assert SECRET not in text
    assert "app:***@db.internal" in text


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (f"sqlite://app:{SECRET}@db.internal/x.db", "names no file"),
        (f"file://app:{SECRET}@db.internal/runs", "names no local folder"),
        (f"mysql://db.internal/runs?user=app&password={SECRET}", "unknown scheme 'mysql:'"),
        (f"redis://db.internal/0#token={SECRET}", "unknown scheme 'redis:'"),
        (f"sqlite:///runs.db?password={SECRET}", "has a query or fragment"),
        (f"file:///var/runs?key={SECRET}", "has a query or fragment"),
    ],
)
def test_no_error_shows_a_secret_of_the_url(url: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=message) as raised:
        open_store(url)
    assert SECRET not in "".join(traceback.format_exception(raised.value))
    assert "***" in str(raised.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://app:pw@db/runs", "postgresql://app:***@db/runs"),
        ("postgresql://app:p@ss@db/runs", "postgresql://app:***@db/runs"),
        ("postgresql://app@db/runs", "postgresql://app@db/runs"),
        (
            "postgres://db/runs?sslmode=require&sslpassword=pw&Api_Key=k&schema=s",
            "postgres://db/runs?sslmode=require&sslpassword=***&Api_Key=***&schema=s",
        ),
        ("mysql://db/x?PASSWORD=s1;pwd=s2#token=s3", "mysql://db/x?PASSWORD=***;pwd=***#token=***"),
        (
            "host=db port=5432 user=app password='a b\\' c' sslkey=/k dbname=runs",
            "host=db port=5432 user=app password=*** sslkey=*** dbname=runs",
        ),
        ("host=db password = pw dbname=runs", "host=db password = *** dbname=runs"),
        ("sqlite:///runs.db", "sqlite:///runs.db"),
        ("runs.db", "runs.db"),
        ("memory:", "memory:"),
    ],
)
def test_redact_url_replaces_each_secret(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    for secret in url_secrets(url):
        assert secret not in shown.replace("***", "")


def test_url_secrets_lists_each_form_a_message_may_quote() -> None:
    assert url_secrets("postgresql://app:p%40ss@db/runs?token=t+1") == (
        "p%40ss",
        "p@ss",
        "t 1",
        "t+1",
    )
    assert url_secrets("host=db password='a b\\' c'") == ("'a b\\' c'", "a b' c")
    assert url_secrets("postgresql://app@db/runs") == ()


def test_a_bare_path_opens_the_store_the_command_line_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with open_store("runs.db") as relative:  # not there yet: made on first use
        assert isinstance(relative, SQLiteStore)
        relative.save(State(id="r"))
    with open_store(str(tmp_path / "runs.db")) as absolute:
        assert [info.id for info in absolute.list()] == ["r"]
    (tmp_path / "folder").mkdir()
    folder = open_store("folder")
    assert isinstance(folder, FileStore)
    assert folder.path == Path("folder")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match="is a file, but not an SQLite store"):
        open_store("notes.txt")
    with pytest.raises(ValueError, match="takes a URL or a path"):
        open_store("")


def test_not_a_str() -> None:
    with pytest.raises(TypeError, match="a URL"):
        open_store(Path("runs.db"))  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]


def test_postgresql_url_with_a_schema_parameter() -> None:
    with fresh_schema() as (dsn, schema):
        url = dsn.replace("postgres@", f"postgres:{SECRET}@") + f"?schema={schema}"
        with open_store(url, pool_size=2) as store:
            assert isinstance(store, PostgresStore)
            assert store.schema == schema
            store.save(State(id="pg", messages=[Message.user("hi")]))
            assert store.load("pg").messages[0].text == "hi"
            assert SECRET not in repr(store)
        with open_store(dsn.replace("postgresql:", "postgres:"), schema=schema) as again:
            assert [info.id for info in again.list()] == ["pg"]


def test_the_password_is_never_in_reprs_logs_or_errors(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    # Nothing listens on port 1: connecting fails, with the password in the DSN.
    url = f"postgresql://app:{SECRET}@127.0.0.1:1/runs"
    store = open_store(url, timeout=2)
    assert SECRET not in repr(store)
    assert "app:***@127.0.0.1:1/runs" in repr(store)
    with pytest.raises(StoreError) as raised:
        store.list()
    shown = "".join(traceback.format_exception(raised.value))
    assert "could not reach the database" in shown
    assert SECRET not in shown
    error: BaseException | None = raised.value
    while error is not None:
        assert SECRET not in str(error)
        assert SECRET not in repr(error)
        error = error.__cause__ or error.__context__
    store.close()
    # libpq's key=value form, and a URL whose password needs quoting
    quoted = PostgresStore(f"host=127.0.0.1 port=1 user=app password={SECRET}x dbname=runs")
    assert SECRET not in repr(quoted)
    encoded = PostgresStore("postgresql://app:p%40ss%2Fword@127.0.0.1:1/runs", timeout=1)
    assert "p%40ss" not in repr(encoded)
    assert "p@ss" not in repr(encoded)
    with pytest.raises(StoreError) as again:
        encoded.list()
    assert "p@ss/word" not in str(again.value)
    assert "p%40ss" not in str(again.value)
    # a DSN that does not parse: the message does not quote it
    with pytest.raises(ValueError, match="does not parse") as bad:
        PostgresStore(f"host=127.0.0.1 password={SECRET} port")
    assert SECRET not in str(bad.value)
    bad_port = PostgresStore(f"postgresql://app:{SECRET}@127.0.0.1:notaport/runs")
    with pytest.raises(StoreError, match="notaport") as refused:
        bad_port.list()
    assert SECRET not in str(refused.value)
    assert SECRET not in repr(bad_port)
    for record in caplog.records:
        assert SECRET not in record.getMessage()
