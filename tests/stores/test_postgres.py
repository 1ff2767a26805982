"""`PostgresStore` against a real server: the contract suite in every mode, and what is its own.

The server is the one `make test` starts (see `tests.postgres`); each test gets a schema of its
own, dropped afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stores import PostgresStore
from stores.contract import StoreContract
from tests.postgres import fresh_schema


class TestPostgresStore(StoreContract):
    colours = ("sync", "async")
    asyncio_only = False  # the async twins run the sync driver in a worker thread

    @pytest.fixture
    def store(self) -> Iterator[PostgresStore]:
        with fresh_schema() as (dsn, schema):
            store = PostgresStore(dsn, schema=schema, pool_size=4)
            try:
                yield store
            finally:
                store.close()
