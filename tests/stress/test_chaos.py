"""Chaos: a lead with parallel subagents is SIGKILLed again and again, and every State survives.

A fork server (`tests.stress.chaos_worker`) runs the lead of one store on, life after life, and
each life is killed: right at its start (while it opens the store and makes the first saves),
at a random moment of its run, or by itself inside a save (between a log append and its info
replace, before or after an SQLite ``COMMIT``, in the middle of a torn write). After each kill
this process checks a copy of the store: every State lists and loads, replays to an equal
snapshot, has no pending call, still holds every entry whose save had returned, opens its
children, and runs on to an answer with the same agents. The next life then recovers the
original store (so kills also land during recovery).

Each case has a fixed seed, printed in every failure; ``CHAOS_SEED=<seed> pytest
tests/stress/test_chaos.py -k <backend>`` reruns that case alone. Kills at a random moment are
timed, so a rerun lands them elsewhere; kills inside a save land on the same step.

The default run kills each backend 30 times; the long run (``pytest -m long``) 1,000 times.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator import Message, RunStartEntry, State, ToolResultEntry, waiting_for_user
from stores import encode_entry
from tests.postgres import postgres_dsn
from tests.stress.chaos_worker import (
    BACKENDS,
    LEAD,
    Life,
    build_agents,
    copy_store,
    open_store,
    remove_store,
    store_path,
)

ROOT = Path(__file__).resolve().parents[2]

CI_KILLS = 30  # per backend, in the default run
LONG_KILLS = 1000  # per backend, behind the `long` marker
KILLS_PER_CASE = 10  # then a new store: the histories stay short, so checks stay cheap
# About how many save steps one life takes (measured: FileStore ~1,160, SQLite ~680,
# PostgreSQL 134: a save is one statement).
STEPS = {"file": 1200, "sqlite": 700, "aiosqlite": 650, "postgres": 140}
MODES = ("startup", "mid-run", "in-save")
MODE_WEIGHTS = (1, 2, 2)

pytestmark = pytest.mark.skipif(
    not hasattr(os, "pidfd_open"), reason="the fork server needs fork and pidfd_open (Linux)"
)


class ForkServer:
    """The worker process: one JSON command in, one JSON answer out, per life."""

    def __init__(self, log: Path) -> None:
        self._log = log.open("w")
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.stress.chaos_worker"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )

    def live(self, life: Life) -> dict[str, Any]:
        process = self._process
        assert process.stdin is not None
        assert process.stdout is not None
        process.stdin.write(json.dumps(asdict(life)) + "\n")
        process.stdin.flush()
        ready, _, _ = select.select([process.stdout], [], [], life.timeout + 30)
        line = process.stdout.readline() if ready else ""
        assert line, f"the fork server did not answer (seed {life.seed}):\n{self.errors()}"
        return json.loads(line)

    def errors(self) -> str:
        self._log.flush()
        return Path(self._log.name).read_text()[-4000:]

    def close(self) -> None:
        assert self._process.stdin is not None
        self._process.stdin.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        assert self._process.stdout is not None
        self._process.stdout.close()
        self._log.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ForkServer]:
    started = ForkServer(tmp_path / "worker.log")
    try:
        yield started
    finally:
        started.close()


# -- checking a store after a kill ------------------------------------------------------------


def read_records(path: Path) -> list[tuple[str, int, str]]:
    """The saves that returned: (state id, entry count, sha256 of the last entry's encoding)."""
    if not path.exists():
        return []
    data = path.read_text(encoding="ascii")
    lines = data[: data.rfind("\n") + 1].splitlines()  # a cut-off last line is not a record
    records: list[tuple[str, int, str]] = []
    for line in lines:
        state_id, count, digest = line.split()
        records.append((state_id, int(count), digest))
    return records


def agent_of(state: State) -> str:
    start = next(entry for entry in state.history if isinstance(entry, RunStartEntry))
    assert start.content.agent is not None
    return start.content.agent


def child_ids(state: State) -> list[str]:
    return [
        child_id
        for entry in state.history
        if isinstance(entry, ToolResultEntry)
        for child_id in entry.child_ids
    ]


async def check_store(backend: str, folder: Path, records: Path, where: str) -> int:
    """Check every State of the store in `folder` (a copy: it is changed); how many it has."""
    store = open_store(backend, store_path(backend, folder))
    try:
        return await _check(store, backend, read_records(records), where)
    finally:
        close = getattr(store, "aclose", None)
        if close is not None:
            await close()


async def _check(store: Any, backend: str, records: list[tuple[str, int, str]], where: str) -> int:
    states: dict[str, State] = {}
    for info in await store.alist():
        state = await store.aload(info.id)
        assert state.id == info.id, where
        assert State(history=state.history).snapshot() == state.snapshot(), f"{where}: {state.id}"
        assert state.pending_calls == (), f"{where}: {state.id} has pending calls"
        states[state.id] = state

    for state_id, count, digest in records:
        assert state_id in states, f"{where}: {state_id} was saved ({count} entries) and is gone"
        history = states[state_id].history
        assert len(history) >= count, f"{where}: {state_id} lost entries after {len(history)}"
        kept = history[count - 1]
        assert kept.seq == count - 1, where
        assert hashlib.sha256(encode_entry(kept)).hexdigest() == digest, (
            f"{where}: {state_id} entry {count - 1} ({kept.kind}) differs from the one saved"
        )

    for state in states.values():
        for child_id in child_ids(state):
            if backend == "aiosqlite":
                child = await state.achild(child_id)
            else:
                child = await anyio.to_thread.run_sync(state.child, child_id)
            assert child.parent_id == state.id, f"{where}: {child_id}"
            assert child.snapshot() == states[child_id].snapshot(), f"{where}: {child_id}"

    # Every State runs on to an answer with the same agents; the lead gets a new question if
    # it had answered, so it always runs again.
    agents = build_agents(store)
    lead = states.get(LEAD)
    if lead is not None and waiting_for_user(lead):
        lead.add_message(Message.user("One more time."))
    for state_id, loaded in states.items():
        # Read again: a parent that ran before may have continued this child (resume), and a
        # copy read before that would be an older one.
        state = loaded if state_id == LEAD else await store.aload(state_id)
        if waiting_for_user(state):
            continue
        await agents.by_name[agent_of(state)].arun(state)
        assert waiting_for_user(state), f"{where}: {state.id} did not finish"
        assert state.answer, f"{where}: {state.id} did not answer"
        again = await store.aload(state.id)
        assert again.snapshot() == state.snapshot(), f"{where}: {state.id} saved differently"
    assert lead is None or lead.answer == "done after 2 rounds", where
    return len(states)


# -- the cases --------------------------------------------------------------------------------


def plan_life(backend: str, folder: Path, records: Path, rng: random.Random) -> tuple[str, Life]:
    mode = rng.choices(MODES, MODE_WEIGHTS)[0]
    life = Life(backend=backend, folder=str(folder), record=str(records), seed=rng.getrandbits(32))
    if mode == "startup":
        return mode, replace(life, kill_after=rng.uniform(0, 0.015))
    if mode == "mid-run":
        return mode, replace(life, kill_after=rng.uniform(0.015, 0.3))
    return mode, replace(life, kill_step=rng.randint(1, STEPS[backend]))


def run_case(server: ForkServer, backend: str, seed: int, kills: int, tmp: Path) -> Counter[str]:
    """Kill lives on one store until `kills` kills landed; check the store after each life.

    Returns the count of kills by mode, and of lives that ended before their kill.
    """
    rng = random.Random(seed)
    folder, records, copy = tmp / f"{backend}-{seed}", tmp / f"{backend}-{seed}.saved", tmp / "copy"
    folder.mkdir()
    try:
        return _kill_lives(server, backend, seed, kills, (folder, records, copy), rng)
    finally:
        remove_store(backend, folder)  # a PostgreSQL store's schema too


def _kill_lives(
    server: ForkServer,
    backend: str,
    seed: int,
    kills: int,
    paths: tuple[Path, Path, Path],
    rng: random.Random,
) -> Counter[str]:
    folder, records, copy = paths
    tally: Counter[str] = Counter()
    lives = 0
    while tally.total() - tally["ended"] < kills:
        lives += 1
        assert lives <= 4 * kills, f"CHAOS_SEED={seed} {backend}: too few kills landed ({tally})"
        mode, life = plan_life(backend, folder, records, rng)
        where = f"CHAOS_SEED={seed} backend={backend} life={lives} ({mode}, seed {life.seed})"
        ended = server.live(life)
        assert not ended["timed_out"], f"{where}: the life hung\n{server.errors()}"
        if ended["signal"] == signal.SIGKILL:
            tally[mode] += 1
        else:
            assert ended["code"] == 0, f"{where}: the life failed: {ended}\n{server.errors()}"
            tally["ended"] += 1
        copy_store(backend, folder, copy)
        # The checks run on trio every other life (aiosqlite runs on asyncio only).
        loop = "trio" if lives % 2 and backend != "aiosqlite" else "asyncio"
        try:
            anyio.run(check_store, backend, copy, records, where, backend=loop)
        except AssertionError:
            raise
        except Exception as error:  # name the case, so that it can be run again
            raise AssertionError(f"{where}: {error!r}") from error
        finally:
            remove_store(backend, copy)
    return tally


def kill_backend(server: ForkServer, backend: str, kills: int, first_seed: int, tmp: Path) -> str:
    started = time.monotonic()
    tally: Counter[str] = Counter()
    seed = first_seed
    while tally.total() - tally["ended"] < kills:
        left = kills - (tally.total() - tally["ended"])
        tally += run_case(server, backend, seed, min(KILLS_PER_CASE, left), tmp)
        seed += 1
    return (
        f"{backend}: {tally.total() - tally['ended']} kills ({dict(tally)}), seeds"
        f" {first_seed}..{seed - 1}, {time.monotonic() - started:.1f} s"
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_state_survives_kills(server: ForkServer, backend: str, tmp_path: Path) -> None:
    if backend == "postgres":
        postgres_dsn()  # skipped without a server, unless required (CI): then it fails
    if "CHAOS_SEED" in os.environ:  # rerun the case a failure named
        seed = int(os.environ["CHAOS_SEED"])
        print(run_case(server, backend, seed, KILLS_PER_CASE, tmp_path))
        return
    print(kill_backend(server, backend, CI_KILLS, 1000 * (1 + BACKENDS.index(backend)), tmp_path))


@pytest.mark.long
@pytest.mark.timeout(3 * 3600)
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_state_survives_a_thousand_kills(
    server: ForkServer, backend: str, tmp_path: Path
) -> None:
    if backend == "postgres":
        postgres_dsn()
    first = 100_000 * (1 + BACKENDS.index(backend))
    print(kill_backend(server, backend, LONG_KILLS, first, tmp_path))
