"""`RateLimit` and `RateLimited`: pacing, concurrent slots, holds, headers, the waits reported.

The pace is checked through what a take reserves (the times of the row and the wait they give),
not by timing requests; the wall-clock rate across processes is in test_rate_processes.py.
"""

from __future__ import annotations

import builtins
import dataclasses
import uuid
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
import sniffio

from orchestrator import (
    Agent,
    Image,
    Loop,
    Message,
    RateLimitError,
    RateLimitWaited,
    Reply,
    Reporter,
    State,
    TextBlock,
    ToolResultBlock,
    Usage,
    tool,
)
from orchestrator._record._fold import Seq
from orchestrator.models import (
    AnthropicModel,
    OpenAIModel,
    RateLimit,
    RateLimited,
    Request,
    RetryPolicy,
)
from orchestrator.models._base import estimate_tokens, message_tokens
from orchestrator.models._rate import LocalRates, header_hold
from orchestrator.testing import FakeModel, tool_call
from stores import AioSQLiteStore, MemoryStore, PostgresStore, SQLiteStore
from stores.backend import AsyncRateLimits, RateAsk, RateTimes, next_times
from tests.models._server import ScriptedServer
from tests.models.wire_anthropic import text_reply as anthropic_reply
from tests.models.wire_openai import error, text_reply
from tests.postgres import fresh_schema

STORES = ("local", "memory", "sqlite", "aiosqlite", "postgres")


@asynccontextmanager
async def rate_table(kind: str, tmp_path: Path) -> AsyncGenerator[AsyncRateLimits]:
    """A table of rate-limit rows of each kind."""
    if kind == "local":
        yield LocalRates()
    elif kind == "memory":
        yield MemoryStore()
    elif kind == "sqlite":
        with SQLiteStore(tmp_path / "rates.db") as store:
            yield store
    elif kind == "aiosqlite":
        if sniffio.current_async_library() == "trio":
            pytest.skip("AioSQLiteStore runs on asyncio only")
        async with AioSQLiteStore(tmp_path / "rates.db") as store:
            yield store
    else:
        with fresh_schema("rate") as (dsn, schema), PostgresStore(dsn, schema=schema) as store:
            yield store


# -- the rule --------------------------------------------------------------------------------------


def test_a_take_moves_each_time_on_from_itself_or_from_now() -> None:
    ask = RateAsk(requests=0.5, tokens=2.0)
    assert next_times(None, 100.0, ask) == (100.5, 102.0)
    assert next_times((103.0, 90.0), 100.0, ask) == (103.5, 102.0)


def test_the_wait_is_what_the_earlier_takes_left_less_the_burst() -> None:
    ask = RateAsk(requests=1.0, tokens=0.0, tolerance=1.0)
    # The requests' time is 3 s ahead after this take: 1 s of it is the take, 1 s the burst.
    assert RateTimes(requests_at=103.0, tokens_at=0.0, now=100.0).wait(ask) == 1.0
    assert RateTimes(requests_at=101.0, tokens_at=0.0, now=100.0).wait(ask) == 0.0
    tokens = RateAsk(requests=0.0, tokens=4.0)
    assert RateTimes(requests_at=0.0, tokens_at=106.0, now=100.0).wait(tokens) == 2.0


# -- every table keeps the rule --------------------------------------------------------------------


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.anyio
async def test_takes_are_put_in_line(kind: str, tmp_path: Path) -> None:
    async with rate_table(kind, tmp_path) as table:
        ask = RateAsk(requests=10.0, tokens=0.0)
        first = await table.arate_take("k", ask)
        second = await table.arate_take("k", ask)
        third = await table.arate_take("k", ask)
        other = await table.arate_take("other", ask)
    assert first.wait(ask) == 0.0
    assert 9.0 < second.wait(ask) <= 10.0
    assert 19.0 < third.wait(ask) <= 20.0
    assert third.requests_at - first.requests_at == pytest.approx(20.0, abs=1.0)
    assert other.wait(ask) == 0.0  # another key has its own pace


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.anyio
async def test_a_hold_makes_every_later_take_wait(kind: str, tmp_path: Path) -> None:
    async with rate_table(kind, tmp_path) as table:
        ask = RateAsk(requests=0.01, tokens=0.0)
        await table.arate_take("k", ask)
        await table.arate_hold("k", 30.0, 0.0)
        after = await table.arate_take("k", ask)
        await table.arate_hold("new", 5.0, 0.0)  # a key never taken is held too
        fresh = await table.arate_take("new", ask)
    assert 29.0 < after.wait(ask) <= 30.0
    assert 4.0 < fresh.wait(ask) <= 5.0


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.anyio
async def test_settling_corrects_the_tokens(kind: str, tmp_path: Path) -> None:
    async with rate_table(kind, tmp_path) as table:
        ask = RateAsk(requests=0.0, tokens=10.0)
        await table.arate_take("k", ask)
        await table.arate_settle("k", -8.0)  # the request spent less than it was taken with
        after = await table.arate_take("k", ask)
    assert 1.0 < after.wait(ask) <= 2.0


def test_the_process_table_waits_as_a_take_says() -> None:
    table = LocalRates()
    ask = RateAsk(requests=10.0, tokens=0.0, tolerance=10.0)
    assert table.delay("k", ask) == 0.0
    assert table.delay("k", ask) == 0.0  # the burst: two at once
    assert 9.0 < table.delay("k", ask) <= 10.0
    assert 19.0 < table.take("k", ask).wait(ask) <= 20.0
    tokens = RateAsk(requests=0.0, tokens=3.0)
    assert table.delay("t", tokens) == 0.0
    assert 2.0 < table.delay("t", tokens) <= 3.0  # the first request's tokens, paid off


def test_stores_that_share_limits_say_so() -> None:
    assert isinstance(MemoryStore(), AsyncRateLimits)
    assert issubclass(SQLiteStore, AsyncRateLimits)
    assert issubclass(PostgresStore, AsyncRateLimits)


# -- RateLimit ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({}, ValueError, "limits nothing"),
        ({"requests_per_minute": 0}, ValueError, "must be > 0"),
        ({"requests_per_minute": "60"}, TypeError, "must be a number"),
        ({"tokens_per_minute": float("inf")}, TypeError, "must be a number"),
        ({"concurrent": 0}, ValueError, "int >= 1"),
        ({"requests_per_minute": 60, "burst": 0}, ValueError, "burst"),
        ({"requests_per_minute": 60, "store": object()}, TypeError, "keeps rate limits"),
        ({"requests_per_minute": 60, "store": MemoryStore()}, ValueError, "needs key="),
        ({"requests_per_minute": 60, "key": ""}, TypeError, "non-empty str"),
        ({"concurrent": 1, "lease": 0}, ValueError, "lease=...\\) must be > 0"),
        ({"concurrent": 1, "lease": None}, TypeError, "lease=...\\) must be seconds"),
    ],
)
def test_bad_limits_say_how_to_fix_them(
    options: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        RateLimit(**options)


@pytest.mark.anyio
async def test_limits_with_one_key_share_their_pace_in_a_process() -> None:
    store = MemoryStore()
    first = RateLimit(requests_per_minute=6, store=store, key="shared")
    second = RateLimit(requests_per_minute=6, store=store, key="shared")
    async with first.request():
        pass
    ask = RateAsk(requests=10.0, tokens=0.0)
    with anyio.move_on_after(0.05):  # the second waits ~10 s: its reservation is made at once
        async with second.request():
            pytest.fail("the second request went without waiting")
    after = await store.arate_take("shared", ask)
    assert 19.0 < after.wait(ask) <= 20.0


@pytest.mark.anyio
async def test_concurrent_requests_are_capped() -> None:
    limit = RateLimit(concurrent=2)
    running = 0
    most = 0

    async def one() -> None:
        nonlocal running, most
        async with limit.request():
            running += 1
            most = max(most, running)
            await anyio.sleep(0.01)
            running -= 1

    async with anyio.create_task_group() as group:
        for _ in range(6):
            group.start_soon(one)
    assert most == 2


@pytest.mark.anyio
async def test_a_cancelled_wait_gives_back_no_slot() -> None:
    limit = RateLimit(concurrent=1)
    async with limit.request():
        with anyio.move_on_after(0.02):
            async with limit.request():
                pytest.fail("two requests at once")
    async with limit.request():  # the slot is free again
        pass


# -- concurrent slots in a store -------------------------------------------------------------------


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.anyio
async def test_a_slot_has_one_holder_until_released_or_its_lease_runs_out(
    kind: str, tmp_path: Path
) -> None:
    async with rate_table(kind, tmp_path) as table:
        assert await table.arate_slot_take("k", 2, "a", 30.0) == 0
        assert await table.arate_slot_take("k", 2, "b", 0.2) == 1
        assert await table.arate_slot_take("k", 2, "c", 30.0) is None  # both held
        assert await table.arate_slot_take("other", 2, "c", 30.0) == 0  # a key of its own
        assert await table.arate_slot_renew("k", 0, "a", 30.0)
        assert not await table.arate_slot_renew("k", 0, "b", 30.0)  # not b's
        await table.arate_slot_release("k", 0, "b")  # not b's: still a's
        assert await table.arate_slot_take("k", 2, "c", 30.0) is None
        await table.arate_slot_release("k", 0, "a")
        assert await table.arate_slot_take("k", 2, "c", 30.0) == 0
        await anyio.sleep(0.3)  # b's lease ran out: its slot is free, and b lost it
        assert await table.arate_slot_take("k", 2, "d", 30.0) == 1
        assert not await table.arate_slot_renew("k", 1, "b", 30.0)
        await table.arate_slot_release("k", 1, "b")
        assert await table.arate_slot_take("k", 2, "e", 30.0) is None  # still d's


@pytest.mark.parametrize("kind", ["memory", "sqlite", "aiosqlite", "postgres"])
@pytest.mark.anyio
async def test_limits_sharing_a_store_share_its_concurrent_slots(kind: str, tmp_path: Path) -> None:
    # Two RateLimits of one key (as two processes would have) never run more than 2 at once.
    async with rate_table(kind, tmp_path) as table:
        key = f"slots-{uuid.uuid4().hex[:8]}"
        limits = [RateLimit(concurrent=2, store=table, key=key) for _ in range(2)]
        running = 0
        most = 0

        async def one(limit: RateLimit) -> None:
            nonlocal running, most
            async with limit.request():
                running += 1
                most = max(most, running)
                await anyio.sleep(0.02)
                running -= 1

        async with anyio.create_task_group() as group:
            for number in range(8):
                group.start_soon(one, limits[number % 2])
        assert most == 2
        assert await table.arate_slot_take(key, 2, "after", 30.0) == 0  # every slot given back


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
@pytest.mark.anyio
async def test_a_cancelled_request_gives_its_store_slot_back(kind: str, tmp_path: Path) -> None:
    async with rate_table(kind, tmp_path) as table:
        limit = RateLimit(concurrent=1, store=table, key="cancelled")
        with anyio.move_on_after(0.05) as scope:
            async with limit.request():
                await anyio.sleep(30)
        assert scope.cancelled_caught
        # Given back when cancelled, not when its 30 s lease runs out.
        assert await table.arate_slot_take("cancelled", 1, "next", 30.0) == 0


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
@pytest.mark.anyio
async def test_a_long_request_keeps_its_slot_past_its_lease(kind: str, tmp_path: Path) -> None:
    # A lease of 1 s, renewed every third of it: 2.5 s later the slot is still the request's.
    async with rate_table(kind, tmp_path) as table:
        limit = RateLimit(concurrent=1, store=table, key="long", lease=1.0)
        taken: list[int | None] = []
        async with limit.request():
            for _ in range(5):
                await anyio.sleep(0.5)
                taken.append(await table.arate_slot_take("long", 1, "other", 30.0))
        assert taken == [None] * 5
        assert await table.arate_slot_take("long", 1, "other", 30.0) == 0


@pytest.mark.anyio
async def test_a_wait_for_a_store_slot_is_reported() -> None:
    store = MemoryStore()
    key = f"slot-wait-{uuid.uuid4().hex[:8]}"
    limit = RateLimit(concurrent=1, store=store, key=key)
    recorder = WaitRecorder()
    agent = Agent(RateLimited(FakeModel(["done"]), limit), reporter=recorder)
    state = State(messages=[Message.user("Hi")])
    async with limit.request():
        with anyio.move_on_after(0.2):
            await agent.arun(state)
    assert [(name, delay) for _, name, delay in recorder.waits] == [(key, 0.0)]


def test_the_estimate_counts_the_request_text() -> None:
    small = Request(system=None, messages=(Message.user("Hi"),))
    large = Request(system="x" * 4000, messages=(Message.user("Hi"),))
    assert estimate_tokens(small) < 20
    assert 1000 <= estimate_tokens(large) < 1020


# -- provider headers ------------------------------------------------------------------------------


def test_headers_hold_until_the_reset_of_what_is_used_up() -> None:
    assert header_hold({"x-ratelimit-remaining-requests": "0"}) == 0  # no reset: not known
    assert header_hold(
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1m0.5s"}
    ) == pytest.approx(60.5)
    assert header_hold(
        {
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": "20ms",
            "x-ratelimit-remaining-tokens": "0",
            "x-ratelimit-reset-tokens": "2s",
        }
    ) == pytest.approx(2.0)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    reset = (now + timedelta(seconds=7)).isoformat().replace("+00:00", "Z")
    anthropic = {
        "anthropic-ratelimit-tokens-remaining": "0",
        "anthropic-ratelimit-tokens-reset": reset,
    }
    assert header_hold(anthropic, now=now) == pytest.approx(7.0)
    assert header_hold({**anthropic, "anthropic-ratelimit-tokens-reset": "soon"}, now=now) == 0


def test_headers_spread_what_is_left_until_the_reset() -> None:
    """The pace tightens as a provider's limit runs low, not only once nothing is left."""

    def requests_left(count: str) -> dict[str, str]:
        return {"x-ratelimit-remaining-requests": count, "x-ratelimit-reset-requests": "12s"}

    holds = [header_hold(requests_left(str(n))) for n in (5, 3, 2, 1, 0)]
    assert holds == pytest.approx([2.0, 3.0, 4.0, 6.0, 12.0])
    tokens_left = {"x-ratelimit-remaining-tokens": "9000", "x-ratelimit-reset-tokens": "10s"}
    assert header_hold(tokens_left, tokens=1000) == pytest.approx(1.0)  # 10 such requests
    assert header_hold(tokens_left) == pytest.approx(10 / 9001)  # size unknown: one token
    both = {**requests_left("1"), **tokens_left}
    assert header_hold(both, tokens=1000) == pytest.approx(6.0)  # the longest
    assert header_hold({**requests_left("many")}) == 0  # not a number: ignored
    assert header_hold({**requests_left("-1")}) == 0


@pytest.mark.anyio
async def test_headers_with_plenty_left_cost_no_hold_and_running_low_holds(
    server: ScriptedServer,
) -> None:
    plenty = {"x-ratelimit-remaining-requests": "4999", "x-ratelimit-reset-requests": "12ms"}
    low = {"x-ratelimit-remaining-requests": "2", "x-ratelimit-reset-requests": "30s"}
    server.push(
        dataclasses.replace(text_reply("one"), headers=plenty),
        dataclasses.replace(text_reply("two"), headers=low),
    )
    holds: list[float] = []

    class Holds(MemoryStore):
        async def arate_hold(self, key: str, seconds: float, tolerance: float) -> None:
            holds.append(seconds)
            await super().arate_hold(key, seconds, tolerance)

    store = Holds()
    limit = RateLimit(requests_per_minute=600, store=store, key="openai")
    model = OpenAIModel("gpt-4o", base_url=server.url, api_key="sk-test", rate_limit=limit)
    request = Request(system=None, messages=(Message.user("Hi"),))
    ask = RateAsk(requests=0.0, tokens=0.0)
    assert (await model.respond(request)).message.text == "one"
    # 12 ms over 5,000 requests is less than the limit's own 0.1 s a request: no hold written.
    assert holds == []
    assert (await model.respond(request)).message.text == "two"
    assert holds == [pytest.approx(10.0)]
    # Two left for 30 s: the next request waits a third of it, not the whole reset.
    assert 9.0 < (await store.arate_take("openai", ask)).wait(ask) <= 10.0


@pytest.mark.anyio
async def test_a_provider_model_reads_the_headers_and_holds_the_limit(
    server: ScriptedServer,
) -> None:
    exhausted = dataclasses.replace(
        text_reply("ok"),
        headers={"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "30s"},
    )
    server.push(exhausted)
    store = MemoryStore()
    limit = RateLimit(requests_per_minute=60_000, store=store, key="openai")
    model = OpenAIModel("gpt-4o", base_url=server.url, api_key="sk-test", rate_limit=limit)
    assert model.rate_limit is limit
    reply = await model.respond(Request(system=None, messages=(Message.user("Hi"),)))
    assert reply.message.text == "ok"
    ask = RateAsk(requests=0.001, tokens=0.0)
    assert 29.0 < (await store.arate_take("openai", ask)).wait(ask) <= 30.0


@pytest.mark.anyio
async def test_a_429_holds_the_whole_limit_back(server: ScriptedServer) -> None:
    server.push(error(429, "slow down", retry_after="20"), text_reply("ok"))
    store = MemoryStore()
    limit = RateLimit(requests_per_minute=60_000, store=store, key="openai")
    model = OpenAIModel(
        "gpt-4o",
        base_url=server.url,
        api_key="sk-test",
        rate_limit=limit,
        retry=RetryPolicy(retries=0),
    )
    with pytest.raises(RateLimitError):
        await model.respond(Request(system=None, messages=(Message.user("Hi"),)))
    ask = RateAsk(requests=0.001, tokens=0.0)
    assert 19.0 < (await store.arate_take("openai", ask)).wait(ask) <= 20.0


@pytest.mark.anyio
async def test_anthropic_headers_hold_the_limit_too(server: ScriptedServer) -> None:
    until = datetime.now(UTC) + timedelta(seconds=30)
    reset = until.isoformat().replace("+00:00", "Z")
    reply = anthropic_reply("ok")
    server.push(
        dataclasses.replace(
            reply,
            headers={
                "anthropic-ratelimit-tokens-remaining": "0",
                "anthropic-ratelimit-tokens-reset": reset,
            },
        )
    )
    store = MemoryStore()
    limit = RateLimit(tokens_per_minute=1_000_000, store=store, key="anthropic")
    model = AnthropicModel("claude-test", base_url=server.url, api_key="k", rate_limit=limit)
    answer = await model.respond(Request(system=None, messages=(Message.user("Hi"),)))
    assert answer.message.text == "ok"
    # Held until the reset the headers named, however long the request took.
    times = await store.arate_take("anthropic", RateAsk(requests=0.0, tokens=0.0))
    assert times.tokens_at == pytest.approx(until.timestamp(), abs=0.5)
    assert times.requests_at == pytest.approx(until.timestamp(), abs=0.5)


def test_rate_limit_must_be_a_rate_limit() -> None:
    with pytest.raises(TypeError, match="RateLimit"):
        OpenAIModel("gpt-4o", base_url="http://127.0.0.1:1", rate_limit=60)  # pyright: ignore[reportArgumentType]


# -- any model, limited ------------------------------------------------------------------------


class WaitRecorder(Reporter):
    """Notes each wait for a rate limit."""

    def __init__(self) -> None:
        self.waits: builtins.list[tuple[str, str, float]] = []

    def on_rate_limit(self, state: State, limit: str, delay: float) -> None:
        self.waits.append((state.id, limit, delay))


@tool
def lookup(topic: str) -> str:
    """Look a topic up.

    Args:
        topic: What to look up.
    """
    return f"{topic}: found"


@pytest.mark.anyio
async def test_a_wait_is_reported_and_streamed_as_an_event() -> None:
    # 10 requests a minute: the second request of the run waits ~6 s, cut short here.
    key = f"events-{uuid.uuid4().hex}"  # a process's limit outlives the test: a new key
    limit = RateLimit(requests_per_minute=10, key=key)
    model = RateLimited(FakeModel([tool_call("lookup", topic="x"), "done"]), limit)
    recorder = WaitRecorder()
    agent = Agent(model, tools=[lookup], reporter=recorder)
    state = State(messages=[Message.user("Find x")])
    seen: list[Any] = []
    with anyio.move_on_after(0.2):
        async with agent.events(state) as events:
            async for event in events:
                seen.append(event)
    [(state_id, name, delay)] = recorder.waits
    assert (state_id, name) == (state.id, key)
    assert 5.0 < delay <= 6.0
    [waited] = [event for event in seen if isinstance(event, RateLimitWaited)]
    assert (waited.limit, waited.delay, waited.state_id) == (key, delay, state.id)
    assert RateLimitWaited.model_validate_json(waited.model_dump_json()) == waited


@pytest.mark.anyio
async def test_rate_limited_settles_tokens_and_holds_on_a_rate_limit_error() -> None:
    store = MemoryStore()
    limit = RateLimit(tokens_per_minute=60_000, store=store, key="any")
    spent = Reply(Message.assistant("ok"), Usage(input_tokens=1000, output_tokens=1000))
    model = RateLimited(FakeModel([spent, RateLimitError("busy")]), limit, backoff=15)
    assert (model.name, model.context_window, model.limit) == ("fake", 200_000, limit)
    request = Request(system=None, messages=(Message.user("Hi"),))
    assert await model.respond(request) == spent
    # 2,000 tokens at 1,000 a second: the next request waits ~2 s for them.
    ask = RateAsk(requests=0.0, tokens=0.0)
    assert 1.5 < (await store.arate_take("any", ask)).wait(ask) <= 2.0
    with pytest.raises(RateLimitError):
        await model.respond(request)
    assert 14.0 < (await store.arate_take("any", ask)).wait(ask) <= 15.0


@pytest.mark.anyio
async def test_rate_limited_settles_and_holds_a_process_limit_it_asks_through_with_no_ticket() -> (
    None
):
    # This process's limit with no concurrent cap: RateLimited paces and settles it directly.
    spent = Reply(Message.assistant("ok"), Usage(input_tokens=1000, output_tokens=1000))
    request = Request(system=None, messages=(Message.user("Hi"),))
    settled = RateLimit(tokens_per_minute=60_000, key=f"settled-{uuid.uuid4().hex}")
    assert await RateLimited(FakeModel([spent]), settled).respond(request) == spent
    # 2,000 tokens at 1,000 a second: the next request waits ~2 s for them.
    wait = settled.pace_now()
    assert wait is not None
    assert 1.5 < wait <= 2.0
    held = RateLimit(tokens_per_minute=60_000, key=f"held-{uuid.uuid4().hex}")
    model = RateLimited(FakeModel([RateLimitError("busy")]), held, backoff=15)
    with pytest.raises(RateLimitError):
        await model.respond(request)
    wait = held.pace_now()
    assert wait is not None
    assert 14.0 < wait <= 15.0


@pytest.mark.anyio
async def test_rate_limited_gives_back_its_slot_when_a_request_fails() -> None:
    limit = RateLimit(concurrent=1, key=f"failed-{uuid.uuid4().hex}")
    model = RateLimited(FakeModel([ValueError("lost"), "ok"]), limit)
    request = Request(None, (Message.user("Hi"),))
    with pytest.raises(ValueError, match="lost"):
        await model.respond(request)
    with anyio.fail_after(5):  # only bounds a hang: the failed request's slot is free again
        reply = await model.respond(request)
    assert reply.message == Message.assistant("ok")


def test_rate_limited_checks_its_arguments() -> None:
    with pytest.raises(TypeError, match="takes a RateLimit"):
        RateLimited(FakeModel(["x"]), 60)  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="backoff"):
        RateLimited(FakeModel(["x"]), RateLimit(concurrent=1), backoff=-1)


def test_a_sync_agent_shares_a_process_limit_across_its_runs() -> None:
    # Each sync run has its own event loop; the limit is the process's all the same.
    limit = RateLimit(requests_per_minute=60_000, concurrent=1)
    agent = Agent(RateLimited(FakeModel(["a", "b"]), limit))
    assert agent.run(State(messages=[Message.user("1")])) == "a"
    assert agent.run(State(messages=[Message.user("2")])) == "b"


def test_the_estimate_is_the_same_for_messages_seen_before() -> None:
    call = tool_call("lookup", topic="x")
    messages = (
        Message.user("Find x"),
        Message.assistant(tool_calls=[call]),
        Message("user", (ToolResultBlock(call.id, (TextBlock("x: found"),)),)),
    )
    first = estimate_tokens(Request("Be brief.", messages, (lookup.spec,)))
    again = estimate_tokens(Request("Be brief.", messages, (lookup.spec,)))
    longer = estimate_tokens(
        Request("Be brief.", (*messages, Message.user("y" * 400)), (lookup.spec,))
    )
    assert first == again
    assert longer - first == (400 + 16) // 4  # the new message only: text and its overhead


def test_a_request_that_carries_its_estimate_is_not_counted() -> None:
    request = Request(None, (Message.user("x" * 4_000),), estimate=7)
    assert estimate_tokens(request) == 7
    counted = dataclasses.replace(request, estimate=None)
    assert estimate_tokens(counted) == 1_000 + 4 + 1
    assert counted == request  # a hint, not what the model is told


@pytest.mark.anyio
async def test_rate_limited_paces_a_request_by_the_estimate_it_carries() -> None:
    limit = RateLimit(tokens_per_minute=60_000, key=f"carried-{uuid.uuid4().hex}")
    model = RateLimited(FakeModel([ValueError("lost")]), limit)
    with pytest.raises(ValueError, match="lost"):  # no usage came back: the estimate stays paid
        await model.respond(Request(None, (Message.user("Hi"),), estimate=5_000))
    # 5,000 tokens at 1,000 a second: the next request waits ~5 s for them.
    wait = limit.pace_now()
    assert wait is not None
    assert 4.5 < wait <= 5.0


_REPORTED = Usage(input_tokens=100, output_tokens=20, requests=1)


@pytest.mark.anyio
async def test_a_run_estimates_each_request_from_the_usage_its_model_reported() -> None:
    call = tool_call("lookup", topic="x")
    fake = FakeModel([Reply(Message.assistant(tool_calls=[call]), _REPORTED), "done"])
    await Agent(fake, tools=[lookup]).arun("Find x")
    first, second = fake.requests
    assert first.estimate is None  # nothing reported yet: a limit counts the request whole
    results = second.messages[-1]
    assert results.content[0] == ToolResultBlock(call.id, (TextBlock("x: found"),))
    # The reply's input and output, and the tool results since: the next request holds them.
    assert second.estimate == 100 + 20 + message_tokens([results])
    unreported = FakeModel([tool_call("lookup", topic="x"), "done"])  # its usage: no tokens
    await Agent(unreported, tools=[lookup]).arun("Find x")
    assert [request.estimate for request in unreported.requests] == [None, None]


@pytest.mark.anyio
async def test_after_a_compaction_a_run_counts_its_next_request_whole() -> None:
    async def think_compact_and_go_on(agent: Agent, state: State) -> None:
        await agent.athink(state)
        if state.turn == 1:
            state.compact("They said hi.")
        state.add_message(Message.user("And then?"))

    fake = FakeModel([Reply(Message.assistant("a"), _REPORTED)] * 3)
    await Agent(fake, loop=Loop(think_compact_and_go_on, limit=3)).arun("Hi")
    estimates = [request.estimate for request in fake.requests]
    assert estimates == [None, None, 120 + message_tokens([Message.user("And then?")])]


def test_an_image_counts_as_1000_tokens_in_a_message_or_a_tool_result() -> None:
    image = Image(b"\x89PNG", "image/png")

    def result(*content: TextBlock | Image) -> Request:
        return Request(None, (Message("user", (ToolResultBlock("call_1", content),)),))

    assert (
        estimate_tokens(result(TextBlock("ok"), image)) - estimate_tokens(result(TextBlock("ok")))
        == 1000
    )
    assert (
        estimate_tokens(Request(None, (Message.user("Hi", image),)))
        - estimate_tokens(Request(None, (Message.user("Hi"),)))
        == 1000
    )


def test_the_estimate_follows_a_conversation_that_branches_or_shrinks() -> None:
    # A State's requests share their start; a restore or a cleared result changes the middle.
    first, second, third = Message.user("a" * 40), Message.assistant("b" * 80), Message.user("c")

    def fresh(*messages: Message) -> int:  # new objects: nothing of them is known yet
        return estimate_tokens(Request(None, tuple(Message(m.role, m.content) for m in messages)))

    def estimate(*messages: Message) -> int:
        return estimate_tokens(Request(None, messages))

    other = Message.assistant("d" * 400)
    assert estimate(first, second, third) == fresh(first, second, third)
    assert estimate(first, other, third) == fresh(first, other, third)
    assert estimate(first, second) == fresh(first, second)
    assert estimate(first) == fresh(first)
    assert estimate(first, second, third, other) == fresh(first, second, third, other)
    assert estimate(first, other) - estimate(first, second) == (400 - 80) // 4


def test_the_estimate_follows_a_states_messages_as_they_grow_and_branch() -> None:
    # A State's messages are a Seq: later requests extend it, a restore branches from it.
    first, second, third = Message.user("a" * 40), Message.assistant("b" * 80), Message.user("c")
    other = Message.assistant("d" * 400)

    def fresh(*messages: Message) -> int:  # new objects: nothing of them is known yet
        return estimate_tokens(Request(None, tuple(Message(m.role, m.content) for m in messages)))

    start = Seq[Message].of([first])
    grown = start.append(second).append(third)
    assert estimate_tokens(Request(None, start)) == fresh(first)
    assert estimate_tokens(Request(None, grown)) == fresh(first, second, third)
    branch = start.append(other)  # shares the start only: its items are copied
    assert estimate_tokens(Request(None, branch)) == fresh(first, other)
    assert estimate_tokens(Request(None, grown.append(other))) == fresh(first, second, third, other)
    assert estimate_tokens(Request(None, start)) == fresh(first)


class Counting:
    """A model that notes how many of its requests are under way at once."""

    name = "counting"
    context_window = None

    def __init__(self) -> None:
        self.running = 0
        self.most = 0
        self.asked = 0

    async def respond(self, request: Request, *, on_text: Any = None) -> Reply:
        self.asked += 1
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await anyio.sleep(0.01)
        finally:
            self.running -= 1
        return Reply(Message.assistant("done"))


@pytest.mark.anyio
async def test_parallel_children_share_their_model_s_limit() -> None:
    counting = Counting()
    limit = RateLimit(requests_per_minute=60_000, concurrent=3, key=f"tree-{uuid.uuid4().hex}")
    worker = Agent(RateLimited(counting, limit), name="worker", description="Does a task.")
    calls = [tool_call("worker", task=f"task {i}") for i in range(20)]
    recorder = WaitRecorder()
    lead = Agent(FakeModel([calls, "All done."]), tools=[worker], reporter=recorder)
    state = State(messages=[Message.user("Do twenty tasks")])
    assert await lead.arun(state) == "All done."
    assert counting.asked == 20
    assert counting.most == 3
    waited = {state_id for state_id, _, _ in recorder.waits}
    assert waited  # children waited for a slot, and said so
    assert all(state.child(state_id).parent_id == state.id for state_id in waited)
