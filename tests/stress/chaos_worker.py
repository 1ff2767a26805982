"""The process the chaos test kills: a lead agent fanning out to subagents, saved in a store.

Run as ``python -m tests.stress.chaos_worker``, it is a fork server: it imports everything once,
then reads one JSON command per line on stdin. For each command it forks a child that lives one
*life* (runs the lead of the store on by a few rounds), and kills that child with SIGKILL after
``kill_after`` seconds unless it ended first; or the child kills itself at save step
``kill_step``. Then it writes one JSON line on stdout: how the child ended. It ends at EOF.
The PostgreSQL backend uses the test server (`tests.postgres`), one schema per store folder.

Forking from one warmed-up process costs a few milliseconds a life where a new interpreter
costs about 0.5 s of imports (measured on the 2-core test machine), so a test can afford
hundreds of kills. The server is the killed process's parent, so the pid it kills cannot have
been reused by another process: it is reaped only after the kill.

A *save step* is one call, before or after, of what a store does to its files: for `FileStore`,
`os.write`, `os.fsync`, `os.replace`, `os.rename`, `os.ftruncate` and `os.mkdir` on paths under
the store (a kill before a write first writes a random part of it: a torn write, as a power cut
leaves); for the SQLite stores, each statement their sqlite3 connection runs (so between the
inserts and ``COMMIT``, or right after ``COMMIT``); for `PostgresStore`, each statement a psycopg
connection runs (a save is one statement: before it is sent, or after it committed and before
the store knows). The hooks are installed in the child only.

After each save returns, the child appends ``<state id> <entry count> <sha256 of the last
entry's encoding>`` to the record file: the test checks that every such entry is still there.

The same module builds the agents for the test process (`build_agents`), which runs the
recovered States again with them.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import select
import shutil
import signal
import sqlite3
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from orchestrator import (
    Agent,
    Message,
    Reply,
    State,
    Usage,
    aapprove,
    awaiting,
    tool,
    waiting_for_user,
)
from orchestrator.models import Request
from orchestrator.permissions import ApproveLater
from orchestrator.testing import FakeModel, tool_call
from stores import AioSQLiteStore, FileStore, PostgresStore, SQLiteStore, encode_entry
from tests.postgres import DSN_VARIABLE

BACKENDS = ("file", "sqlite", "aiosqlite", "postgres")
LEAD = "lead"
ROUNDS = 2  # fan-out turns the lead takes for each user message
REPLIES = 100_000  # a FakeModel's script: the same function again and again
SPECIALISTS = ("researcher", "reviewer")

# -- the agents ---------------------------------------------------------------------------------

_pause = 0.0  # how long each tool waits: the worker sets it so that kills land mid-run


def set_pause(seconds: float) -> None:
    """Make every tool wait `seconds` (0 in the test process, which only finishes runs)."""
    global _pause
    _pause = seconds


@tool
async def lookup(key: str) -> str:
    """Look a key up (async)."""
    await anyio.sleep(_pause)
    return f"{key}=42"


@tool
def measure(size: int) -> int:
    """Measure something (sync, in a worker thread)."""
    time.sleep(_pause)
    return size * 2


def _since_user(request: Request) -> list[Message]:
    """The messages after the last message a user typed (tool results are not typed)."""
    messages = list(request.messages)
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.role == "user" and not message.tool_results:
            return messages[index + 1 :]
    return messages


def _reply(text: str, tokens: int) -> Reply:
    usage = Usage(input_tokens=tokens, output_tokens=tokens // 4, requests=1, cost=0.001)
    return Reply(Message.assistant(text), usage, stop_reason="end_turn", model="fake")


def specialist_reply(request: Request) -> Any:
    """A subagent: call both tools at once, then answer from their results."""
    results = [block.text for m in _since_user(request) for block in m.tool_results]
    if not results:
        return [tool_call("lookup", key="k"), tool_call("measure", size=21)]
    return _reply("found: " + "; ".join(results), 120)


def lead_reply(request: Request) -> Any:
    """The lead: fan out to every subagent and both tools, `ROUNDS` times, then answer.

    It decides from the request alone, so a run cut off anywhere continues after recovery.
    """
    rounds = sum(1 for message in _since_user(request) if message.tool_results)
    if rounds < ROUNDS:
        task = f"round {rounds}"
        return [
            tool_call("researcher", task=task),
            tool_call("reviewer", task=task),
            tool_call("delegate_async", topic=task),
            tool_call("delegate_sync", topic=task),
            tool_call("lookup", key=task.replace(" ", "-")),
            tool_call("measure", size=rounds),
        ]
    return _reply(f"done after {rounds} rounds", 900)


@dataclass(frozen=True)
class Agents:
    """The lead and the agents its States' children were run by, by name."""

    lead: Agent
    by_name: dict[str, Agent]


def build_agents(store: Any) -> Agents:
    """The lead agent, saved in `store`, and its subagents (saved in the lead's store).

    The lead reaches subagents four ways: ``agent.as_tool()``, an Agent in ``tools=``, an
    async tool that awaits ``helper.arun``, and a sync tool that calls ``helper.run`` from its
    worker thread.
    """

    def specialist(name: str) -> Agent:
        return Agent(
            FakeModel([specialist_reply] * REPLIES),
            tools=[lookup, measure],
            name=name,
            description=f"The {name}.",
        )

    researcher, reviewer = specialist("researcher"), specialist("reviewer")
    helper = specialist("helper")

    @tool
    async def delegate_async(topic: str) -> str:
        """Ask the helper, awaiting its run."""
        return str(await helper.arun(State(messages=[Message.user(topic)])))

    @tool
    def delegate_sync(topic: str) -> str:
        """Ask the helper from a worker thread."""
        return str(helper.run(State(messages=[Message.user(topic)])))

    lead = Agent(
        FakeModel([lead_reply] * REPLIES),
        tools=[researcher.as_tool(), reviewer, delegate_async, delegate_sync, lookup, measure],
        name=LEAD,
        store=store,
    )
    by_name = {agent.name: agent for agent in (lead, researcher, reviewer, helper)}
    return Agents(lead, {str(name): agent for name, agent in by_name.items()})


# -- the approval scenario: root -> manager -> mailer, whose mail waits for a person -----------

ROOT = "root"  # the State the approval lives are about
_sent = ""  # where `send` marks each mail it sends (a file outside the store)


def set_sent(path: str) -> None:
    """Make `send` append a line to the file `path` for each mail it sends."""
    global _sent
    _sent = path


@tool
def send(to: str) -> str:
    """Send a mail (sync): marked in a file, so the test counts how often it ran."""
    with open(_sent, "a", encoding="ascii") as out:
        out.write(to + "\n")
    return f"sent to {to}"


def _then(call: Any, answer: str) -> Callable[[Request], Any]:
    """A model that makes `call` first, then answers `answer` once a result came back.

    Any result, even one a recovery closed as ``unknown``: the call is never made again.
    """

    def reply(request: Request) -> Any:
        if any(m.tool_results for m in request.messages):
            return _reply(answer, 40)
        return call

    return reply


def build_approval_agents(store: Any, *, nested: bool) -> Agents:
    """The root agent (saved in `store`) and its mailer subagent, or a manager between them.

    The mailer's `send` waits for a person (`ApproveLater`): its call is listed at the root.
    """
    mailer = Agent(
        FakeModel([_then(tool_call("send", to="bob"), "mailer done")] * REPLIES),
        name="mailer",
        description="Sends mail.",
        tools=[send],
        permissions=[ApproveLater("send")],
    )
    agents = [mailer]
    if nested:
        agents.append(
            Agent(
                FakeModel([_then(tool_call("mailer", task="mail bob"), "manager done")] * REPLIES),
                name="manager",
                description="Has mail sent.",
                tools=[mailer],
            )
        )
    first = agents[-1]
    task = "mail bob" if first is mailer else "go"
    root = Agent(
        FakeModel([_then(tool_call(str(first.name), task=task), "root done")] * REPLIES),
        name="approver",
        tools=[first],
        store=store,
    )
    return Agents(root, {str(agent.name): agent for agent in (root, *agents)})


def approval_note(record: str) -> Path:
    """Where a life notes ``start`` before an approval and ``end`` after it returned."""
    return Path(record).with_suffix(".approving")


def sent_marks(record: str) -> Path:
    """Where the lives of one store mark the mails `send` sent."""
    return Path(record).with_suffix(".sent")


# -- the stores, recording each save that returned --------------------------------------------


class _Recorder:
    """Appends a line per returned save to the record file (flushed: a SIGKILL keeps it)."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", encoding="ascii")  # noqa: SIM115 - lives as long as the life
        self._lock = threading.Lock()

    def before(self, state: State) -> tuple[str, int, str] | None:
        """What a save of `state` started now will have written once it returns."""
        history = state.history
        if not history:
            return None
        return state.id, len(history), hashlib.sha256(encode_entry(history[-1])).hexdigest()

    def saved(self, what: tuple[str, int, str] | None) -> None:
        if what is not None:
            with self._lock:
                self._file.write(f"{what[0]} {what[1]} {what[2]}\n")
                self._file.flush()


def open_store(backend: str, path: str, record: str | None = None) -> Any:
    """The store of `backend` at `path`; with `record`, each returned save is appended there."""
    if record is None:
        if backend == "postgres":
            return PostgresStore(os.environ[DSN_VARIABLE], schema=path, pool_size=4)
        return {"file": FileStore, "sqlite": SQLiteStore, "aiosqlite": AioSQLiteStore}[backend](
            path
        )
    recorder = _Recorder(record)

    class RecordingFileStore(FileStore):
        def save(self, state: State) -> None:
            what = recorder.before(state)
            super().save(state)
            recorder.saved(what)

    class RecordingSQLiteStore(SQLiteStore):
        def save(self, state: State) -> None:
            what = recorder.before(state)
            super().save(state)
            recorder.saved(what)

        async def asave(self, state: State) -> None:
            what = recorder.before(state)
            await super().asave(state)
            recorder.saved(what)

    class RecordingAioSQLiteStore(AioSQLiteStore):
        async def asave(self, state: State) -> None:
            what = recorder.before(state)
            await super().asave(state)
            recorder.saved(what)

    class RecordingPostgresStore(PostgresStore):
        def save(self, state: State) -> None:
            what = recorder.before(state)
            super().save(state)
            recorder.saved(what)

        async def asave(self, state: State) -> None:
            what = recorder.before(state)
            await super().asave(state)
            recorder.saved(what)

    if backend == "postgres":
        return RecordingPostgresStore(os.environ[DSN_VARIABLE], schema=path, pool_size=4)
    kinds = {
        "file": RecordingFileStore,
        "sqlite": RecordingSQLiteStore,
        "aiosqlite": RecordingAioSQLiteStore,
    }
    return kinds[backend](path)


def store_path(backend: str, folder: Path) -> str:
    """Where a store of `backend` lives in `folder` (a folder of its own, so it copies whole).

    A PostgreSQL store's is the name of its schema, made from the folder's path.
    """
    if backend == "postgres":
        return "chaos_" + hashlib.blake2b(str(folder).encode(), digest_size=8).hexdigest()
    return str(folder if backend == "file" else folder / "runs.db")


_TABLES = ("meta", "states", "entries", "memory", "memory_effects")


def copy_store(backend: str, folder: Path, copy: Path) -> None:
    """Copy the store in `folder` to `copy` as it is now (the check changes the copy)."""
    shutil.copytree(folder, copy)
    if backend != "postgres":
        return
    import psycopg
    from psycopg import sql

    source, target = store_path(backend, folder), store_path(backend, copy)
    with psycopg.connect(os.environ[DSN_VARIABLE], autocommit=True) as connection:
        exists = connection.execute("SELECT to_regnamespace(%s) IS NOT NULL", (source,))
        row = exists.fetchone()
        if row is None or not row[0]:  # killed before it made its schema
            return
        with connection.transaction():
            connection.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(target)))
            tables = connection.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s", (source,)
            ).fetchall()
            for (table,) in tables:
                old, new = sql.Identifier(source, table), sql.Identifier(target, table)
                connection.execute(
                    sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL)").format(new, old)
                )
                connection.execute(sql.SQL("INSERT INTO {} SELECT * FROM {}").format(new, old))


def remove_store(backend: str, folder: Path) -> None:
    """Remove the store in `folder` (a copy made by `copy_store`)."""
    shutil.rmtree(folder)
    if backend == "postgres":
        import psycopg
        from psycopg import sql

        with psycopg.connect(os.environ[DSN_VARIABLE], autocommit=True) as connection:
            schema = sql.Identifier(store_path(backend, folder))
            connection.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(schema))


# -- killing the child inside a save ----------------------------------------------------------


class _Steps:
    """Counts save steps; at step `kill_at` the process kills itself."""

    def __init__(self, kill_at: int | None, rng: random.Random) -> None:
        self.count = 0
        self.kill_at = kill_at
        self.rng = rng

    def arm(self, after: int | None) -> None:
        """Die `after` steps from now (None: leave the step to die at as it is)."""
        if after is not None:
            self.kill_at = self.count + after

    def step(self) -> bool:
        """Count one step; True if this is the one to die at (the caller may tear a write)."""
        self.count += 1
        return self.count == self.kill_at

    @staticmethod
    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)


def _under(root: str, fd_or_path: int | str | os.PathLike[str]) -> bool:
    """Whether the open file `fd_or_path`, or the path, is inside the folder `root`."""
    try:
        if isinstance(fd_or_path, int):
            target = os.readlink(f"/proc/self/fd/{fd_or_path}")
        else:
            target = os.path.abspath(fd_or_path)
    except OSError:
        return False
    return target.startswith(root + os.sep)


def _hook_file_store(root: str, steps: _Steps) -> None:
    """Count `FileStore`'s file operations under `root` as save steps."""
    root = os.path.realpath(root)

    def wrap(name: str) -> None:
        real: Callable[..., Any] = getattr(os, name)

        def hooked(*args: Any) -> Any:
            if not _under(root, args[0]):
                return real(*args)
            if steps.step():
                if name == "write" and len(args[1]) > 1:  # a torn write: part of it is written
                    real(args[0], bytes(args[1])[: steps.rng.randrange(1, len(args[1]))])
                steps.die()
            result = real(*args)
            if steps.step():
                steps.die()
            return result

        setattr(os, name, hooked)

    for name in ("write", "fsync", "replace", "rename", "ftruncate", "mkdir"):
        wrap(name)


class _KillingConnection(sqlite3.Connection):
    """A sqlite3 connection that counts each statement, before and after, as a save step."""

    steps: _Steps

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        if self.steps.step():
            self.steps.die()
        cursor = super().execute(sql, parameters)
        if self.steps.step():
            self.steps.die()
        return cursor

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
        if self.steps.step():
            self.steps.die()
        cursor = super().executemany(sql, parameters)
        if self.steps.step():
            self.steps.die()
        return cursor


def _hook_postgres(steps: _Steps) -> None:
    """Count each statement a psycopg connection of this process runs, before and after."""
    import psycopg

    real = psycopg.Connection.execute

    def execute(self: psycopg.Connection[Any], *args: Any, **kwargs: Any) -> Any:
        if steps.step():
            steps.die()
        cursor = real(self, *args, **kwargs)
        if steps.step():
            steps.die()
        return cursor

    psycopg.Connection.execute = execute  # type: ignore[method-assign]


def _hook_sqlite(steps: _Steps) -> None:
    """Make every sqlite3 connection of this process a `_KillingConnection`."""
    real = sqlite3.connect
    _KillingConnection.steps = steps

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        return real(*args, factory=_KillingConnection, **kwargs)

    sqlite3.connect = connect  # type: ignore[assignment]


# -- one life ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Life:
    """One command: run the lead of the store on, by `rounds` user messages."""

    backend: str
    folder: str
    record: str
    seed: int
    rounds: int = 2
    pause: float = 0.002
    kill_step: int | None = None
    kill_after: float | None = None
    timeout: float = 60.0
    scenario: str = "lead"  # or "approval": approve the root's waiting call, then run it
    nested: bool = False  # approval: a manager subagent between the root and the mailer
    kill_in_approval: int | None = None  # die at this step counted from the approval's start


async def _live(life: Life, rng: random.Random, steps: _Steps) -> None:
    store = open_store(life.backend, store_path(life.backend, Path(life.folder)), life.record)
    if life.scenario == "approval":
        try:
            await _live_approval(life, store, steps)
        finally:
            await _close(store)
        return
    try:
        agents = build_agents(store)
        try:
            lead = await store.aload(LEAD)
        except LookupError:
            lead = State(id=LEAD, messages=[Message.user("Investigate round 0.")])
        for number in range(life.rounds):
            if lead.messages and waiting_for_user(lead):  # the last run ended: ask for more
                lead.add_message(Message.user(f"Investigate more ({rng.random():.6f}, {number})."))
            await agents.lead.arun(lead)
    finally:
        await _close(store)


async def _close(store: Any) -> None:
    close = getattr(store, "aclose", None)
    if close is not None:
        await close()


async def _live_approval(life: Life, store: Any, steps: _Steps) -> None:
    """Approve the calls waiting at the root (noting when), then run the root to its end."""
    set_sent(str(sent_marks(life.record)))
    agents = build_approval_agents(store, nested=life.nested)
    root = await store.aload(ROOT)
    if waiting_for_user(root):
        return  # answered: nothing left to do
    note = approval_note(life.record)
    for item in awaiting(root):
        with note.open("a", encoding="ascii") as out:
            out.write("start\n")
        steps.arm(life.kill_in_approval)
        await aapprove(root, item.call.id, by="chaos")
        with note.open("a", encoding="ascii") as out:
            out.write("end\n")
    await agents.lead.arun(root)


def _live_and_exit(life: Life) -> None:
    """The forked child: live, then leave without running any of the server's cleanup."""
    code = 0
    try:
        rng = random.Random(life.seed)
        set_pause(life.pause)
        steps = _Steps(life.kill_step, rng)
        if life.backend == "file":
            _hook_file_store(life.folder, steps)
        elif life.backend == "postgres":
            _hook_postgres(steps)
        else:
            _hook_sqlite(steps)
        backend = "asyncio" if life.backend == "aiosqlite" or rng.random() < 0.5 else "trio"
        anyio.run(_live, life, rng, steps, backend=backend)
    except BaseException:
        traceback.print_exc()
        code = 3
    finally:
        sys.stderr.flush()
        os._exit(code)


def _serve_one(life: Life) -> dict[str, Any]:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        _live_and_exit(life)
    started = time.monotonic()
    pidfd = os.pidfd_open(pid)
    try:
        wait = life.timeout if life.kill_after is None else min(life.kill_after, life.timeout)
        ready, _, _ = select.select([pidfd], [], [], wait)
        if not ready:  # still running, and not yet reaped: the pid is still our child's
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(pidfd)
    return {
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "timed_out": not ready and life.kill_after is None,
        "seconds": time.monotonic() - started,
    }


def serve() -> None:
    """Read commands (JSON `Life` fields) from stdin until EOF; answer each with one line."""
    for line in sys.stdin:
        answer = _serve_one(Life(**json.loads(line)))
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
