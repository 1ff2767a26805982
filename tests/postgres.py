"""The PostgreSQL server the tests use: its DSN, and a fresh schema per test.

`make test` runs the suite through ``scripts/with_postgres.sh``, which starts a throwaway server
and sets ``ORCHESTRATOR_TEST_POSTGRES_DSN``; it also sets ``ORCHESTRATOR_TEST_POSTGRES=required``,
and so does CI (``CI`` set), so there a missing server fails every PostgreSQL test. Run by hand
without a server (plain ``pytest``), those tests are skipped, saying how to run them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Generator
from contextlib import contextmanager

import pytest

DSN_VARIABLE = "ORCHESTRATOR_TEST_POSTGRES_DSN"
REQUIRED_VARIABLE = "ORCHESTRATOR_TEST_POSTGRES"


def required() -> bool:
    """Whether the PostgreSQL tests must run (CI, or the test command): never skipped then."""
    return os.environ.get(REQUIRED_VARIABLE) == "required" or bool(os.environ.get("CI"))


def postgres_dsn() -> str:
    """The test server's DSN; skips the test if there is none and it is not required."""
    dsn = os.environ.get(DSN_VARIABLE)
    if dsn:
        return dsn
    message = (
        f"no PostgreSQL server: {DSN_VARIABLE} is not set. Run `make test`, or"
        f" `scripts/with_postgres.sh .venv/bin/python -m pytest ...`, which start one."
    )
    if required():
        pytest.fail(message + f" ({REQUIRED_VARIABLE}=required or CI is set: never skipped)")
    pytest.skip(message)


def drop_schema(dsn: str, schema: str) -> None:
    """Drop `schema` and everything in it."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
        )


@contextmanager
def fresh_schema(prefix: str = "t") -> Generator[tuple[str, str]]:
    """A DSN and the name of a schema no test used, dropped at the end."""
    dsn = postgres_dsn()
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    try:
        yield dsn, schema
    finally:
        drop_schema(dsn, schema)
