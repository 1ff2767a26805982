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
    reopened_folder = open_store(folder.url)
    assert isinstance(reopened_folder, FileStore)
    assert reopened_folder.path == tmp_path / "states"


def test_a_postgres_url_keeps_its_schema_and_other_stores_have_none() -> None:
    dsn = "postgresql://me:secret@db.example:5432/runs"
    assert PostgresStore(dsn).url == dsn
    assert PostgresStore(dsn, schema="team_a").url == f"{dsn}?schema=team_a"
    assert PostgresStore(dsn + "?sslmode=require", schema="b").url == (
        f"{dsn}?sslmode=require&schema=b"
    )
    assert PostgresStore("host=db dbname=runs").url is None  # a key=value DSN is no URL
    opened = open_store(f"{dsn}?schema=team_a")
    assert isinstance(opened, PostgresStore)
    assert opened.schema == "team_a"
    assert MemoryStore().url is None  # no other process can open it


class _AtURL(MemoryStore):
    """A third party's store that another process reaches by URL: it declares `url`."""

    @property
    def url(self) -> str:
        return "memory-server://runs"


def test_a_runner_sends_the_url_a_third_party_store_declares() -> None:
    from orchestrator import Agent, Link
    from orchestrator.runners import ChildJob
    from orchestrator.runners._ray import RayJob
    from orchestrator.testing import FakeModel

    job = ChildJob(
        agent=Agent(FakeModel([]), name="kid"),
        link=Link(parent_id="boss", call_id="c1", scope="boss:0:c1:0"),
        state_id="kid1",
        task="go",
        store=_AtURL(),
    )
    assert RayJob.of(job).store_url == "memory-server://runs"
    with pytest.raises(ValueError, match="has no URL the workers can open"):
        RayJob.of(
            ChildJob(agent=job.agent, link=job.link, state_id="k2", task="go", store=MemoryStore())
        )
