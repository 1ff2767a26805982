"""A process that saves States in a `PostgresStore`, for the tests of several processes at once.

``python -m tests.stores.postgres_worker DSN SCHEMA NAME STATES ROUNDS``: saves `STATES` States
of its own (ids ``NAME-0`` ...) `ROUNDS` times each, one message more each round, all through
the store's client from concurrent tasks, as an agent saves (so its saves go out in group
commits), then prints ``done``.
"""

from __future__ import annotations

import sys

import anyio

from orchestrator import Message, State
from orchestrator._record._store_client import client_of
from stores import PostgresStore


async def main(dsn: str, schema: str, name: str, count: int, rounds: int) -> None:
    async with PostgresStore(dsn, schema=schema, pool_size=2) as store:
        states = [State(id=f"{name}-{i}", messages=[Message.user(name)]) for i in range(count)]
        client = client_of(store)

        async def save(state: State) -> None:
            await client.save(state)

        for round_ in range(rounds):
            async with anyio.create_task_group() as group:
                for state in states:
                    state.add_message(Message.user(f"{name} round {round_}"))
                    group.start_soon(save, state)


if __name__ == "__main__":
    dsn, schema, name, count, rounds = sys.argv[1:6]
    anyio.run(main, dsn, schema, name, int(count), int(rounds))
    print("done", flush=True)
