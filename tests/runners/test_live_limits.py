"""A child run elsewhere counts against its parent's limits as it saves, not when it ends.

The children run on `ThreadRunner` (a thread and event loop of their own, as on a worker), in
a shared SQLite file; two of them at once each get what is left of the lead's limit, so only
the lead, following the store's feed, sees them use it up together.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from orchestrator import (
    Agent,
    AsyncTreeFollowable,
    Limits,
    Message,
    State,
    StoppedByLimit,
    ToolCall,
    TreeEntry,
)
from orchestrator.runners import ChildJob, LocalRunner, Runner
from orchestrator.testing import FakeModel
from stores import SQLiteStore
from tests.doubles import results
from tests.postgres import fresh_schema
from tests.runners import ray_agents
from tests.runners.thread_runner import ThreadRunner

REGISTRY = "tests.runners.ray_agents"
ROOT = Path(__file__).resolve().parents[2]
LIMIT = 2200  # total tokens: 20 of the spender's replies (110 each)


def lead(store: Any, runner: Runner, *tasks: str) -> Agent:
    """A lead that gives the spender `tasks` in one turn (parallel calls), then answers."""
    calls = [ToolCall(f"call_lead_{n}", "spender", {"task": t}) for n, t in enumerate(tasks)]
    return Agent(
        FakeModel([calls, "done"]),
        name="lead",
        tools=[ray_agents.spender(store)],
        store=store,
        runner=runner,
    )


def tokens(state: State) -> int:
    return state.usage.input_tokens + state.usage.output_tokens


@pytest.mark.anyio
async def test_parallel_remote_children_stop_once_together_they_use_up_the_leads_limit(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    state = State(messages=[Message.user("go")])
    runner = ThreadRunner(REGISTRY)
    await lead(store, runner, "spend 60", "spend 60").arun(state, limits=Limits(total_tokens=LIMIT))
    found = results(state)
    kids = [await store.aload(result.child_ids[0]) for result in found]
    # Each child alone was given the whole limit, and would have spent it: stopped by the lead
    # mid-run instead: cancelled there, closed cleanly (no call left open), never answered.
    for result, kid in zip(found, kids, strict=True):
        assert result.outcome == "error"
        assert "was stopped: limit total_tokens=" in result.content.content[0].text  # type: ignore[union-attr]
        assert kid.answer != "spent"
        assert not isinstance(kid.stopped, StoppedByLimit)  # not its own limit
        assert not kid.pending_calls
        assert {r.outcome for r in results(kid)} <= {"done", "interrupted"}
    spent = sum(tokens(kid) for kid in kids)
    assert LIMIT <= spent < 1.5 * LIMIT  # unfollowed, they spend 2 x LIMIT
    stopped = state.stopped
    assert isinstance(stopped, StoppedByLimit)
    assert stopped.limit == "total_tokens"
    assert stopped.by in {kid.id for kid in kids}  # who spent the last of it
    # Counted once: each reply as its save committed, nothing again when the child ended.
    assert stopped.spent == spent == tokens(state)
    assert state.usage.requests == 1 + sum(kid.usage.requests for kid in kids)
    # A reload in a new process keeps the budget: the lead stops at once, before a request.
    again = _rerun(store.path, state.id, LIMIT)
    assert again == {"limit": "total_tokens", "spent": spent, "requests": 0}


@pytest.mark.anyio
async def test_postgres_notifies_the_lead_of_its_remote_childrens_spending() -> None:
    """The same stop through PostgreSQL's feed (LISTEN/NOTIFY), not a polled file."""
    from stores import PostgresStore

    with fresh_schema("live") as (dsn, schema), PostgresStore(dsn, schema=schema) as store:
        state = State(messages=[Message.user("go")])
        await lead(store, ThreadRunner(REGISTRY), "spend 60", "spend 60").arun(
            state, limits=Limits(total_tokens=LIMIT)
        )
        kids = [await store.aload(result.child_ids[0]) for result in results(state)]
    assert all(kid.answer != "spent" and not kid.pending_calls for kid in kids)
    spent = sum(tokens(kid) for kid in kids)
    assert LIMIT <= spent < 1.5 * LIMIT
    stopped = state.stopped
    assert isinstance(stopped, StoppedByLimit)
    assert (stopped.limit, stopped.spent) == ("total_tokens", spent)
    assert stopped.by in {kid.id for kid in kids}


class Reads(SQLiteStore):
    """An SQLite store that counts the feed entries it gives, by State."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.given: dict[str, int] = {}

    def tree_entries(self, root_id: str, **options: Any) -> tuple[TreeEntry, ...]:
        page = super().tree_entries(root_id, **options)  # what every async read comes to
        for item in page:
            self.given[item.state_id] = self.given.get(item.state_id, 0) + 1
        return page


@pytest.mark.anyio
async def test_a_later_remote_child_is_followed_from_where_the_last_one_was(
    tmp_path: Path,
) -> None:
    store = Reads(tmp_path / "runs.db")
    first = [ToolCall("call_first", "spender", {"task": "spend 3"})]
    later = [ToolCall(f"call_later_{n}", "spender", {"task": "spend 60"}) for n in range(2)]
    agent = Agent(
        FakeModel([first, later, "done"]),
        name="lead",
        tools=[ray_agents.spender(store)],
        store=store,
        runner=ThreadRunner(REGISTRY),
    )
    state = State(messages=[Message.user("go")])
    await agent.arun(state, limits=Limits(total_tokens=LIMIT))
    one, *two = results(state)
    kid = await store.aload(one.child_ids[0])
    # The first child's entries were read by its own follower only, not again by the later two
    # (each would read all of them from the start). Its follower may read them twice at most:
    # a page read when the child ended is dropped by the cancel and read again by the catch-up.
    assert len(kid.history) <= store.given[kid.id] <= 2 * len(kid.history)
    kids = [await store.aload(result.child_ids[0]) for result in two]
    assert all(kid.answer != "spent" for kid in kids)
    stopped = state.stopped
    assert isinstance(stopped, StoppedByLimit)
    assert stopped.spent == tokens(state) == 330 + sum(tokens(kid) for kid in kids)


@pytest.mark.anyio
async def test_a_remote_child_within_the_limit_is_counted_once(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    state = State(messages=[Message.user("go")])
    runner = ThreadRunner(REGISTRY)
    # The child spends 330: counted twice (as it saved, and again when it ended), the lead
    # could not send its last request under 500.
    answer = await lead(store, runner, "spend 3").arun(state, limits=Limits(total_tokens=500))
    assert answer == "done"
    assert not isinstance(state.stopped, StoppedByLimit)
    (result,) = results(state)
    kid = await store.aload(result.child_ids[0])
    assert (result.outcome, kid.answer, tokens(kid)) == ("done", "spent", 330)
    assert tokens(state) == 330
    again = _rerun(store.path, state.id, 330)
    assert again == {"limit": "total_tokens", "spent": 330, "requests": 0}


class Here:
    """A runner of its own that runs each child here, in the parent's task (as LocalRunner)."""

    def check(self, job: ChildJob) -> None:
        """Every job runs here."""

    async def run(self, job: ChildJob) -> State:
        return await LocalRunner().run(job)


@pytest.mark.anyio
async def test_a_child_a_runner_runs_here_is_not_counted_again_from_the_feed(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    state = State(messages=[Message.user("go")])
    # It spends against the limits as it runs; counted from the feed too, 660 of 500.
    answer = await lead(store, Here(), "spend 3").arun(state, limits=Limits(total_tokens=500))
    assert answer == "done"
    assert tokens(state) == 330


class Unfollowed:
    """An SQLite store seen only through the `Store` protocol: it has no tree feed."""

    def __init__(self, inner: SQLiteStore) -> None:
        self.inner = inner

    @property
    def url(self) -> str:
        return self.inner.url

    def save(self, state: State) -> None:
        self.inner.save(state)

    def load(self, state_id: str) -> State:
        return self.inner.load(state_id)

    def list(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.list(*args, **kwargs)

    def delete(self, state_id: str) -> None:
        self.inner.delete(state_id)

    async def aload(self, state_id: str) -> State:
        return await self.inner.aload(state_id)


@pytest.mark.anyio
async def test_a_store_without_a_tree_feed_counts_a_remote_child_when_it_ends(
    tmp_path: Path,
) -> None:
    sqlite = SQLiteStore(tmp_path / "runs.db")
    store = Unfollowed(sqlite)
    assert not isinstance(store, AsyncTreeFollowable)
    state = State(messages=[Message.user("go")])
    runner = ThreadRunner(REGISTRY)
    await lead(store, runner, "spend 60", "spend 60").arun(state, limits=Limits(total_tokens=LIMIT))
    kids = [sqlite.load(result.child_ids[0]) for result in results(state)]
    # Unseen while they ran, each spent all it was given (what was left when it started),
    # then stopped itself at it; the lead counted both when they ended, once.
    for kid in kids:
        assert isinstance(kid.stopped, StoppedByLimit)
        assert (kid.stopped.limit, kid.stopped.maximum) == ("total_tokens", LIMIT)
        assert tokens(kid) == LIMIT
    stopped = state.stopped
    assert isinstance(stopped, StoppedByLimit)
    assert (stopped.limit, stopped.spent) == ("total_tokens", 2 * LIMIT)


class Unreadable(SQLiteStore):
    """An SQLite store whose tree feed fails (as a feed of a store that lost its parent)."""

    async def aroot_of(self, state_id: str) -> str:
        raise LookupError(f"no State {state_id!r} here")


@pytest.mark.anyio
async def test_a_tree_feed_that_fails_leaves_the_remote_child_counted_when_it_ends(
    tmp_path: Path,
) -> None:
    store = Unreadable(tmp_path / "runs.db")
    state = State(messages=[Message.user("go")])
    with capture_logs() as logs:
        await lead(store, ThreadRunner(REGISTRY), "spend 3").arun(
            state, limits=Limits(total_tokens=500)
        )
    assert [log["event"] for log in logs].count("state.limit.unfollowed") == 1
    assert tokens(state) == 330  # counted once, at its end: the lead's last request fit
    assert not isinstance(state.stopped, StoppedByLimit)


@pytest.mark.anyio
async def test_a_resumed_remote_child_counts_once_and_is_stopped_as_it_runs(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.db"
    lead_id, before = await anyio.to_thread.run_sync(_crash_mid_children, path, 3)
    store = SQLiteStore(path)
    state = await store.aload(lead_id)
    assert tokens(state) == before < LIMIT  # the children's spending until the crash
    # Reloaded here, a new process: the lead continues both children on the ThreadRunner.
    agent = Agent(
        FakeModel(["done"]),
        name="lead",
        tools=[ray_agents.spender(store)],
        store=store,
        runner=ThreadRunner(REGISTRY),
    )
    await agent.arun(state, limits=Limits(total_tokens=LIMIT))
    late = [r for r in results(state) if r.late]
    kids = [await store.aload(r.child_ids[0]) for r in late]
    # Each was given all that was left, and would have spent it: together they used it up,
    # which only the lead, following the feed, saw; it stopped them while they ran.
    assert len(kids) == 2
    for result in late:
        assert result.outcome == "error"
        assert "was stopped: limit total_tokens=" in result.content.content[0].text  # type: ignore[union-attr]
    for kid in kids:
        assert kid.answer != "spent"
        assert not isinstance(kid.stopped, StoppedByLimit)  # not its own limit
        assert not kid.pending_calls
    spent = sum(tokens(kid) for kid in kids)
    assert LIMIT <= spent < 1.5 * LIMIT
    stopped = state.stopped
    assert isinstance(stopped, StoppedByLimit)
    assert stopped.limit == "total_tokens"
    assert stopped.by in {kid.id for kid in kids}
    # Counted once: what they spent before the crash (in the reloaded budget) not again.
    assert stopped.spent == spent == tokens(state)
    again = _rerun(path, state.id, LIMIT)
    assert again == {"limit": "total_tokens", "spent": spent, "requests": 0}


@pytest.mark.anyio
async def test_a_resumed_remote_child_within_the_limit_is_counted_once(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    lead_id, before = await anyio.to_thread.run_sync(_crash_mid_children, path, 3, "spend 12")
    store = SQLiteStore(path)
    state = await store.aload(lead_id)
    # Together they spend 2640 of 3000; counting what they spent before the crash again (at
    # least 660), the lead could not send its last request.
    agent = Agent(
        FakeModel(["done"]),
        name="lead",
        tools=[ray_agents.spender(store)],
        store=store,
        runner=ThreadRunner(REGISTRY),
    )
    answer = await agent.arun(state, limits=Limits(total_tokens=3000))
    assert answer == "done"
    late = [r for r in results(state) if r.late]
    kids = [await store.aload(r.child_ids[0]) for r in late]
    assert [(r.outcome, kid.answer, tokens(kid)) for r, kid in zip(late, kids, strict=True)] == [
        ("done", "spent", 1320)
    ] * 2
    assert before < tokens(state) == 2640
    again = _rerun(path, state.id, 2640)
    assert again == {"limit": "total_tokens", "spent": 2640, "requests": 0}


@pytest.mark.anyio
async def test_a_resumed_child_a_runner_runs_here_is_not_counted_again_from_the_feed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.db"
    lead_id, _ = await anyio.to_thread.run_sync(_crash_mid_children, path, 3, "spend 12", "Here()")
    store = SQLiteStore(path)
    state = await store.aload(lead_id)
    agent = Agent(
        FakeModel(["done"]),
        name="lead",
        tools=[ray_agents.spender(store)],
        store=store,
        runner=Here(),
    )
    # It spends against the reloaded budget as it runs; counted from the feed too, the lead
    # would pass 3000 and not answer.
    answer = await agent.arun(state, limits=Limits(total_tokens=3000))
    assert answer == "done"
    assert tokens(state) == 2640


def _crash_mid_children(
    path: Path, replies: int, task: str = "spend 60", runner: str = f"ThreadRunner({REGISTRY!r})"
) -> tuple[str, int]:
    """Run a lead of two spenders in a new process; kill it once each saved `replies`.

    Each child has `task`, on `runner` (an expression of the script: a ThreadRunner, ``Here()``).

    Returns the lead's id and what it had spent when it was killed (its children's tokens).
    """
    script = textwrap.dedent(
        f"""
        from orchestrator import Agent, Message, State, ToolCall
        from orchestrator.testing import FakeModel
        from stores import SQLiteStore
        from tests.runners import ray_agents
        from tests.runners.test_live_limits import Here
        from tests.runners.thread_runner import ThreadRunner

        store = SQLiteStore({str(path)!r})
        state = State(messages=[Message.user("go")])
        print(state.id, flush=True)
        calls = [ToolCall(f"call_lead_{{n}}", "spender", {{"task": {task!r}}}) for n in range(2)]
        Agent(FakeModel([calls, "done"]), name="lead", tools=[ray_agents.spender(store)],
              store=store, runner={runner}).run(state)
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert process.stdout is not None
        lead_id = process.stdout.readline().strip()
        store = SQLiteStore(path)
        for _ in range(600):  # at most a minute
            time.sleep(0.1)
            if process.poll() is not None:
                break
            if path.exists() and _replies_of_children(store, lead_id) >= replies:
                break
        assert process.poll() is None, "the lead ended before it could be killed"
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()
    lead = store.load(lead_id)
    assert [r.outcome for r in results(lead)] == ["unknown", "unknown"]
    return lead_id, tokens(lead)


def _replies_of_children(store: SQLiteStore, lead_id: str) -> int:
    """The fewest replies a child of the lead saved (0 before both are saved)."""
    try:
        lead = store.load(lead_id)
    except LookupError:
        return 0
    kids = [kid for r in results(lead) for kid in r.child_ids]
    if len(kids) < 2:
        return 0
    saved = [store.load(kid).history for kid in kids]
    return min(sum(1 for e in history if e.kind == "model_reply") for history in saved)


def _rerun(path: str | Path, state_id: str, limit: int) -> dict[str, Any]:
    """In a new process: load the lead and run it again under `limit` total tokens."""
    script = textwrap.dedent(
        f"""
        import json
        from orchestrator import Agent, Limits, Message
        from orchestrator.testing import FakeModel
        from stores import SQLiteStore

        store = SQLiteStore({str(path)!r})
        state = store.load({state_id!r})
        state.add_message(Message.user("go on"))
        model = FakeModel(["more"])
        Agent(model, store=store).run(state, limits=Limits(total_tokens={limit}))
        stopped = state.stopped
        print(json.dumps({{"limit": stopped.limit, "spent": stopped.spent,
                          "requests": len(model.requests)}}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
