"""`stores.open_store(url)`: each scheme opens its backend; the password is never shown."""

from __future__ import annotations

import logging
import traceback
from pathlib import Path

import pytest

from orchestrator import Message, State, StoreError
from stores import FileStore, MemoryStore, PostgresStore, SQLiteStore, open_store
from tests.postgres import fresh_schema

SECRET = "S3cret-pw_91"


def test_memory() -> None:
    store = open_store("memory:")
    assert isinstance(store, MemoryStore)
    store.save(State(id="m"))
    assert store.load("m").id == "m"


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
    assert "app@127.0.0.1:1/runs" in repr(store)
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
