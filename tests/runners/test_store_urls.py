"""A store that can be reopened elsewhere says how: `store.url`, which `open_store` opens."""

from __future__ import annotations

from pathlib import Path

import pytest

from stores import AioSQLiteStore, FileStore, MemoryStore, PostgresStore, SQLiteStore, open_store


def test_sqlite_and_file_stores_give_absolute_urls_that_open_the_same_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for store in (SQLiteStore("runs one.db"), AioSQLiteStore("runs one.db")):
        assert store.url == f"sqlite:///{tmp_path}/runs%20one.db"
        reopened = open_store(store.url)
        assert isinstance(reopened, SQLiteStore)
        assert Path(reopened.path) == tmp_path / "runs one.db"
    folder = FileStore("states")
    assert folder.url == (tmp_path / "states").as_uri()
    assert open_store(folder.url).path == tmp_path / "states"


def test_a_postgres_url_keeps_its_schema_and_other_stores_have_none() -> None:
    dsn = "postgresql://me:secret@db.example:5432/runs"
    assert PostgresStore(dsn).url == dsn
    assert PostgresStore(dsn, schema="team_a").url == f"{dsn}?schema=team_a"
    assert PostgresStore(dsn + "?sslmode=require", schema="b").url == (
        f"{dsn}?sslmode=require&schema=b"
    )
    assert PostgresStore("host=db dbname=runs").url is None  # a key=value DSN is no URL
    assert open_store(f"{dsn}?schema=team_a").schema == "team_a"
    assert not hasattr(MemoryStore(), "url")
