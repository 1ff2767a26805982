"""Rate limits for model requests: `RateLimit`, and the table it keeps its pace in.

A limit paces requests (and their tokens) with GCRA, the token bucket written as times: a key
has two times, when its requests and its tokens are paid off. Taking a request moves each time
on by what the request costs (one request's share of a minute, its tokens' share) and says when
the request may go. That is one atomic update of one row, so a store can keep the row and
processes on several machines share one pace (`AsyncRateLimits`); by default the row lives in
this process (`LocalRates`), shared by every agent and child that uses the limit's key.

A provider's rate-limit headers tighten the pace gradually (what is left spread until the
reset; nothing left: every caller waits for the reset), and a 429 holds the whole limit back,
not the one caller that got it.

At most `concurrent` requests go at once. Without a store they are counted in this process;
with one, each request holds a slot: a row of the store's ``rate_slots`` table, taken by one
atomic statement, leased for `lease` seconds and renewed while the request runs, so a killed
process's slots come free when their lease runs out.
"""

from __future__ import annotations

import math
import re
import threading
import time
import uuid
from collections.abc import AsyncGenerator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

import anyio
import anyio.lowlevel

from .._apps._reporting import report_rate_limit
from .._base._errors import RateLimitError
from .._base._reply import Reply, Usage
from ._base import Model, Request, TextCallback, estimate_tokens, options_of, resolve_model

__all__ = (
    "AsyncRateLimits",
    "LocalRates",
    "RateAsk",
    "RateLimit",
    "RateLimited",
    "RateTicket",
    "RateTimes",
    "header_hold",
    "next_times",
)

_POLL_FIRST = 0.002  # seconds between looks for a free concurrent slot, doubling...
_POLL_MOST = 0.05  # ...up to this
# A store's slot is a write per look: its looks start later and stop doubling later.
_STORE_POLL_FIRST = 0.005
_STORE_POLL_MOST = 0.2
_LEASE = 30.0  # seconds a store's slot is held unless renewed (renewed every third of it)


@dataclass(frozen=True, slots=True)
class RateAsk:
    """What one request costs a key: seconds of its requests' time and of its tokens' time.

    `tolerance` is how far ahead of now the requests' time may run before a request waits
    (the burst: ``(burst - 1)`` request intervals).
    """

    requests: float
    tokens: float
    tolerance: float = 0.0


@dataclass(frozen=True, slots=True)
class RateTimes:
    """A key's times after a take: when its requests and its tokens are paid off, and now.

    Times are seconds since the epoch on the clock of whoever keeps the row (a PostgreSQL
    server's own, so machines agree).
    """

    requests_at: float
    tokens_at: float
    now: float

    def wait(self, ask: RateAsk) -> float:
        """Seconds the request that made these times waits before it goes."""
        requests = self.requests_at - ask.requests - ask.tolerance
        tokens = self.tokens_at - ask.tokens
        return max(0.0, requests - self.now, tokens - self.now)


def next_times(row: tuple[float, float] | None, now: float, ask: RateAsk) -> tuple[float, float]:
    """A key's times after a take at `now`: what a store's one UPSERT computes.

    Each time moves on from itself, or from now when it is in the past.
    """
    requests_at, tokens_at = row if row is not None else (now, now)
    return max(requests_at, now) + ask.requests, max(tokens_at, now) + ask.tokens


@runtime_checkable
class AsyncRateLimits(Protocol):
    """A table of rate-limit rows, one per key, each changed by one atomic update.

    A store that has it can share a `RateLimit` across processes (``RateLimit(store=...)``).
    Backend authors: `stores.backend` re-exports it, and `next_times` is the rule a take keeps.
    """

    async def arate_take(self, key: str, ask: RateAsk) -> RateTimes:
        """Move `key`'s times on by `ask` (`next_times`) and return them, with the clock's now."""
        ...

    async def arate_hold(self, key: str, seconds: float, tolerance: float) -> None:
        """Let no request of `key` go for `seconds` from now (its times moved on to then)."""
        ...

    async def arate_settle(self, key: str, tokens: float) -> None:
        """Add `tokens` seconds (< 0 gives back) to `key`'s tokens time: the estimate corrected."""
        ...

    async def arate_slot_take(self, key: str, most: int, holder: str, lease: float) -> int | None:
        """Take a free slot of `key`'s `most` (0 to most - 1) for `lease` seconds, or None.

        A slot is free when no one holds it or its lease ran out; taking is one atomic step,
        so no two holders have one slot at once.
        """
        ...

    async def arate_slot_renew(self, key: str, slot: int, holder: str, lease: float) -> bool:
        """Hold `slot` for `lease` seconds from now; False when `holder` no longer holds it."""
        ...

    async def arate_slot_release(self, key: str, slot: int, holder: str) -> None:
        """Free `slot` if `holder` still holds it."""
        ...


class LocalRates:
    """Rate-limit rows kept in this process: the table a `RateLimit` without a store uses.

    A lock keeps each row whole across threads (a sync Agent runs its own event loops), and
    the clock is the wall clock, as a store's.
    """

    __slots__ = ("_rates", "_rates_lock", "_slots")

    def __init__(self) -> None:
        self._rates: dict[str, tuple[float, float]] = {}
        self._rates_lock = threading.Lock()
        self._slots: dict[tuple[str, int], tuple[str, float]] = {}  # (key, slot): holder, until

    def take(self, key: str, ask: RateAsk) -> RateTimes:
        """Move `key`'s times on by `ask` and return them, with now (no I/O: it never blocks)."""
        now = time.time()
        with self._rates_lock:
            times = self._rates[key] = next_times(self._rates.get(key), now, ask)
        return RateTimes(times[0], times[1], now)

    def delay(self, key: str, ask: RateAsk, tokens: float | None = None) -> float:
        """`take`, then the seconds the request waits: what `RateLimit` needs, built cheaper.

        `tokens`, when given, is the tokens' seconds instead of ``ask.tokens`` (no new ask).
        """
        cost = ask.tokens if tokens is None else tokens
        now = time.time()
        with self._rates_lock:
            known = self._rates.get(key)
            if known is None:
                requests_at, tokens_at = now + ask.requests, now + cost
            else:
                requests_at = max(known[0], now) + ask.requests
                tokens_at = max(known[1], now) + cost
            self._rates[key] = (requests_at, tokens_at)
        wait = max(requests_at - ask.requests - ask.tolerance, tokens_at - cost) - now
        return wait if wait > 0 else 0.0

    async def arate_take(self, key: str, ask: RateAsk) -> RateTimes:
        """Move `key`'s times on by `ask` and return them, with now."""
        await anyio.lowlevel.checkpoint()
        return self.take(key, ask)

    async def arate_hold(self, key: str, seconds: float, tolerance: float) -> None:
        """Let no request of `key` go for `seconds` from now."""
        await anyio.lowlevel.checkpoint()
        until = time.time() + seconds
        with self._rates_lock:
            requests_at, tokens_at = self._rates.get(key, (until, until))
            self._rates[key] = (max(requests_at, until + tolerance), max(tokens_at, until))

    async def arate_settle(self, key: str, tokens: float) -> None:
        """Add `tokens` seconds to `key`'s tokens time."""
        await anyio.lowlevel.checkpoint()
        self.settle(key, tokens)

    def settle(self, key: str, tokens: float) -> None:
        """`arate_settle` with no await: what `RateLimit` needs after each request."""
        with self._rates_lock:
            known = self._rates.get(key)
            if known is not None:
                self._rates[key] = (known[0], known[1] + tokens)

    async def arate_slot_take(self, key: str, most: int, holder: str, lease: float) -> int | None:
        """Take a free slot of `key`'s `most` for `lease` seconds, or None."""
        await anyio.lowlevel.checkpoint()
        now = time.time()
        with self._rates_lock:
            for slot in range(most):
                held = self._slots.get((key, slot))
                if held is None or held[1] <= now:
                    self._slots[key, slot] = (holder, now + lease)
                    return slot
        return None

    async def arate_slot_renew(self, key: str, slot: int, holder: str, lease: float) -> bool:
        """Hold `slot` for `lease` seconds from now; False when `holder` no longer holds it."""
        await anyio.lowlevel.checkpoint()
        with self._rates_lock:
            held = self._slots.get((key, slot))
            if held is None or held[0] != holder:
                return False
            self._slots[key, slot] = (holder, time.time() + lease)
            return True

    async def arate_slot_release(self, key: str, slot: int, holder: str) -> None:
        """Free `slot` if `holder` still holds it (no await: it runs in shielded cleanup)."""
        with self._rates_lock:
            held = self._slots.get((key, slot))
            if held is not None and held[0] == holder:
                del self._slots[key, slot]


_LOCAL = LocalRates()
_slots_lock = threading.Lock()
_in_flight: dict[str, int] = {}


def _count(name: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TypeError(f"RateLimit({name}=...) must be a number or None, got {value!r}.")
    if value <= 0:
        raise ValueError(f"RateLimit({name}=...) must be > 0, got {value!r}.")
    return float(value)


class RateLimit:
    """How fast a model may be asked: requests and tokens per minute, and requests at once.

    Without `store`, the limit is this process's: every agent and child whose model has it
    (or another `RateLimit` with the same `key`) shares it. With `store` (a `SQLiteStore`,
    `AioSQLiteStore`, `PostgresStore` or `MemoryStore`), every process that uses the same store
    and `key` shares one pace: a row of the store's ``rate_limits`` table, updated atomically.
    With `store`, `concurrent` holds across those processes too: each request holds one of
    the key's slots in the store's ``rate_slots`` table (every process must give the same
    `concurrent`), leased for `lease` seconds and renewed while the request runs, so the
    slots of a process that was killed come free after `lease`.

    Requests are paced evenly (`burst` of them may go at once after a quiet spell); a request's
    tokens (its input, estimated before it is sent, corrected by the usage it reports) are paid
    off before the next request goes. A provider's rate-limit headers tighten the pace, and a
    429 holds every caller of the limit back, not only the one that got it. A wait is reported
    (`Reporter.on_rate_limit`, the `RateLimitWaited` event).

    Args:
        requests_per_minute: The most requests a minute, or None.
        tokens_per_minute: The most tokens (input and output) a minute, or None.
        concurrent: The most requests under way at once (with `store`, in every process
            sharing it), or None.
        burst: How many requests may go at once after a quiet spell (1: evenly spaced).
        store: A store to share the limit through, across processes and machines.
        key: The limit's name; limits with the same key share their pace. Needed with `store`.
        lease: Seconds a store's concurrent slot outlives a process that stopped renewing it.

    Raises:
        TypeError: An argument has the wrong type, or `store` keeps no rate limits.
        ValueError: No limit is given, a number is not > 0, or `store` has no `key`.

    Example:
        ```python
        limit = RateLimit(requests_per_minute=500, concurrent=8, key="openai")
        model = OpenAIModel("gpt-4o-mini", rate_limit=limit)
        ```
    """

    __slots__ = (
        "_ask",
        "_concurrent",
        "_key",
        "_lease",
        "_local",
        "_rates",
        "_shared",
        "_tokens_step",
        "burst",
    )

    burst: int

    def __init__(
        self,
        *,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
        concurrent: int | None = None,
        burst: int = 1,
        store: object = None,
        key: str | None = None,
        lease: float = _LEASE,
    ) -> None:
        requests = _count("requests_per_minute", requests_per_minute)
        tokens = _count("tokens_per_minute", tokens_per_minute)
        if concurrent is not None and (
            isinstance(concurrent, bool) or not isinstance(concurrent, int) or concurrent < 1
        ):
            raise ValueError(f"RateLimit(concurrent=...) must be an int >= 1, got {concurrent!r}.")
        lease_seconds = _count("lease", lease)
        if lease_seconds is None:
            raise TypeError("RateLimit(lease=...) must be seconds > 0, such as lease=30.")
        self._lease = lease_seconds
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
            raise ValueError(f"RateLimit(burst=...) must be an int >= 1, got {burst!r}.")
        if requests is None and tokens is None and concurrent is None:
            raise ValueError(
                "RateLimit() limits nothing: give requests_per_minute=, tokens_per_minute= or"
                " concurrent=."
            )
        if key is not None and (not isinstance(key, str) or not key):
            raise TypeError(f"RateLimit(key=...) must be a non-empty str, got {key!r}.")
        if store is not None and not isinstance(store, AsyncRateLimits):
            raise TypeError(
                f"RateLimit(store=...) takes a store that keeps rate limits (SQLiteStore,"
                f" AioSQLiteStore, PostgresStore, MemoryStore), got {type(store).__name__}."
            )
        if store is not None and key is None:
            raise ValueError(
                "RateLimit(store=...) needs key=...: the name every process sharing the limit"
                " uses, such as key='openai'."
            )
        interval = 0.0 if requests is None else 60.0 / requests
        self._ask = RateAsk(interval, 0.0, (burst - 1) * interval)
        self._tokens_step = 0.0 if tokens is None else 60.0 / tokens
        self._concurrent = concurrent
        self._rates: AsyncRateLimits = _LOCAL if store is None else store
        self._local = _LOCAL if store is None else None
        self._shared = store is not None
        self._key = key if key is not None else f"local-{id(self):x}"
        self.burst = burst

    @property
    def key(self) -> str:
        """The limit's name, as events and reporters show it."""
        return self._key

    @property
    def counts_tokens(self) -> bool:
        """Whether the limit paces tokens: a request then needs its tokens estimated."""
        return bool(self._tokens_step)

    @property
    def shared(self) -> bool:
        """Whether a store shares the limit (across processes), not this process alone."""
        return self._shared

    @property
    def concurrent(self) -> int | None:
        """The most requests under way at once, or None."""
        return self._concurrent

    def __repr__(self) -> str:
        where = ", store=..." if self._shared else ""
        return f"RateLimit(key={self._key!r}{where})"

    def request(self, tokens: int = 0) -> RateTicket:
        """Wait until a request with `tokens` input tokens may go: ``async with`` it.

        The block is the request. The ticket corrects the tokens (`RateTicket.settle`) and
        holds the limit back (`RateTicket.hold`) when the provider says so. Cancelled while it
        waits, nothing is sent.
        """
        return RateTicket(self, tokens, spacing=max(self._ask.requests, tokens * self._tokens_step))

    async def acquire(self, tokens: int = 0) -> AsyncExitStack:
        """Wait for the pace, then take a concurrent slot: leaving the stack gives it back.

        ``async with limit.request(tokens)`` does both; use this where a block does not fit
        (``held = await limit.acquire()``, then ``await held.aclose()`` when the request ends).
        With a store, the stack holds the task that renews the slot's lease: close it in the
        task that acquired it, before leaving any cancel scope entered since.
        """
        await self._pace(tokens)
        held = AsyncExitStack()
        most = self._concurrent
        if most is not None:
            if self._local is not None:
                await self._local_slot(most)
                held.callback(self._release_local)
            else:
                await held.enter_async_context(self._store_slot(most))
        return held

    def pace_now(self, tokens: int = 0) -> float | None:
        """Pace a request of `tokens` input tokens through this process's limit, with no await.

        The seconds the request waits before it goes, or None for a store's limit (its take is
        I/O: `acquire` it). No concurrent slot is taken.
        """
        local = self._local
        if local is None:
            return None
        ask, step = self._ask, self._tokens_step
        return local.delay(self._key, ask, tokens * step) if ask.requests or step else 0.0

    async def _pace(self, tokens: int) -> None:
        """Wait until the pace lets a request with `tokens` input tokens go."""
        ask = self._ask
        delay = 0.0
        if ask.requests or self._tokens_step:
            if tokens:
                ask = RateAsk(ask.requests, tokens * self._tokens_step, ask.tolerance)
            local = self._local
            if local is not None:  # no await: this process's table never blocks
                delay = local.delay(self._key, ask)
            else:
                delay = (await self._rates.arate_take(self._key, ask)).wait(ask)
        if delay > 0:
            report_rate_limit(self._key, delay)
            await anyio.sleep(delay)
        else:
            await anyio.lowlevel.checkpoint_if_cancelled()

    async def _local_slot(self, most: int) -> None:
        """Wait for one of this process's `most` slots (`_release_local` gives it back)."""
        pause = _POLL_FIRST
        while not self._try_slot(most):
            if pause == _POLL_FIRST:
                report_rate_limit(self._key, 0.0)
            await anyio.sleep(pause)
            pause = min(pause * 2, _POLL_MOST)

    def _try_slot(self, most: int) -> bool:
        with _slots_lock:
            running = _in_flight.get(self._key, 0)
            if running >= most:
                return False
            _in_flight[self._key] = running + 1
            return True

    def _release_local(self) -> None:
        with _slots_lock:
            _in_flight[self._key] -= 1

    @asynccontextmanager
    async def _store_slot(self, most: int) -> AsyncGenerator[None]:
        """Hold one of the store's `most` slots of the key for the block, renewing its lease."""
        rates, key, lease = self._rates, self._key, self._lease
        holder = uuid.uuid4().hex
        pause = _STORE_POLL_FIRST
        while True:
            # Shielded: a slot taken as the caller is cancelled is still given back below.
            taken: int | None = None
            with anyio.CancelScope(shield=True):
                taken = await rates.arate_slot_take(key, most, holder, lease)
            if taken is not None:
                slot = taken
                break
            if pause == _STORE_POLL_FIRST:
                report_rate_limit(key, 0.0)
            await anyio.sleep(pause)
            pause = min(pause * 2, _STORE_POLL_MOST)
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(_renew, rates, key, slot, holder, lease)
                try:
                    yield
                finally:
                    group.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await rates.arate_slot_release(key, slot, holder)

    async def hold(self, seconds: float) -> None:
        """Let no request of this limit go for `seconds` from now (a 429, or nothing left)."""
        if seconds > 0:
            await self._rates.arate_hold(self._key, seconds, self._ask.tolerance)

    async def settle(self, tokens: int) -> None:
        """Count `tokens` more (fewer when < 0) than a request was taken with."""
        if not self.settle_now(tokens):
            await self._rates.arate_settle(self._key, tokens * self._tokens_step)

    def settle_now(self, tokens: int) -> bool:
        """`settle` with no await: False when it is left to do (a store's limit: await `settle`)."""
        if not tokens or not self._tokens_step:
            return True
        if self._local is None:
            return False
        self._local.settle(self._key, tokens * self._tokens_step)
        return True


async def _enter_local(limit: RateLimit, tokens: int) -> bool:
    """Let a request of `tokens` through this process's `limit`; whether it took a slot.

    It makes no stack, and a request that need not wait no event loop hop: it costs what a
    request without the limit does, and a cancellation reaches it where it would reach that
    one (in the model). A slot taken is given back with `RateLimit._release_local`.
    """
    delay = limit.pace_now(tokens)
    if delay:
        await _wait(limit.key, delay)
    most = limit.concurrent
    if most is None:
        return False
    if not limit._try_slot(most):  # pyright: ignore[reportPrivateUsage]
        await limit._local_slot(most)  # pyright: ignore[reportPrivateUsage]
    return True


async def _wait(key: str, seconds: float) -> None:
    """Wait `seconds` for the limit `key` to let a request go, and report the wait."""
    report_rate_limit(key, seconds)
    await anyio.sleep(seconds)


async def _renew(rates: AsyncRateLimits, key: str, slot: int, holder: str, lease: float) -> None:
    """Renew a slot's lease every third of it until cancelled, or until it was lost."""
    while True:
        await anyio.sleep(lease / 3)
        if not await rates.arate_slot_renew(key, slot, holder, lease):
            return


class RateTicket:
    """One request through a `RateLimit` (``async with limit.request(tokens) as ticket``).

    Entering waits for the limit; leaving gives back the concurrent slot.
    """

    __slots__ = ("_held", "_slot", "_spacing", "limit", "tokens")

    limit: RateLimit
    tokens: int

    def __init__(self, limit: RateLimit, tokens: int, *, spacing: float = 0.0) -> None:
        self.limit = limit
        self.tokens = tokens
        self._spacing = spacing  # seconds the limit's own pace puts between such requests
        self._held: AsyncExitStack | None = None
        self._slot = False  # holds one of this process's concurrent slots

    async def __aenter__(self) -> RateTicket:
        limit = self.limit
        if limit.shared:
            self._held = await limit.acquire(self.tokens)
        else:
            self._slot = await _enter_local(limit, self.tokens)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # A process's slot is given back with no I/O, a store's in shielded cleanup.
        if self._slot:
            self._slot = False
            self.limit._release_local()  # pyright: ignore[reportPrivateUsage]
            return
        held, self._held = self._held, None
        if held is not None:
            await held.__aexit__(exc_type, exc, traceback)

    async def settle(self, usage: Usage) -> None:
        """Count what the request really spent (its input and output tokens)."""
        tokens = usage.input_tokens + usage.output_tokens - self.tokens
        if not self.limit.settle_now(tokens):
            await self.limit.settle(tokens)

    async def hold(self, seconds: float) -> None:
        """Hold the whole limit back for `seconds` (the provider asked it to slow down)."""
        await self.limit.hold(seconds)

    async def read_headers(self, headers: Mapping[str, str]) -> None:
        """Tighten the limit to what the provider's headers say is left (`header_hold`).

        The limit is held back only when the headers ask for a longer wait than its own pace
        gives a request: a provider with plenty left costs nothing (no write to a store).
        """
        seconds = header_hold(headers, tokens=self.tokens)
        if seconds > self._spacing:
            await self.limit.hold(seconds)


# -- provider headers -----------------------------------------------------------------------------

# (remaining, reset) header pairs of OpenAI and Anthropic.
_HEADER_PAIRS = (
    ("x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"),
    ("x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"),
    ("anthropic-ratelimit-requests-remaining", "anthropic-ratelimit-requests-reset"),
    ("anthropic-ratelimit-tokens-remaining", "anthropic-ratelimit-tokens-reset"),
    ("anthropic-ratelimit-input-tokens-remaining", "anthropic-ratelimit-input-tokens-reset"),
    ("anthropic-ratelimit-output-tokens-remaining", "anthropic-ratelimit-output-tokens-reset"),
)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_HOLD_MOST = 120.0  # a reset further away than this is not believed


def _reset_seconds(text: str, now: datetime) -> float | None:
    """A reset as seconds from now: an OpenAI duration (minutes, seconds, ms), or an ISO time."""
    text = text.strip()
    parts = _DURATION.findall(text)
    if parts and "".join(number + unit for number, unit in parts) == text:
        return sum(float(number) * _UNITS[unit] for number, unit in parts)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - now).total_seconds()


def header_hold(
    headers: Mapping[str, str], *, now: datetime | None = None, tokens: int = 1
) -> float:
    """Seconds to hold a limit back, so what a provider says is left lasts until its reset.

    For each limit the headers name, what is left is spread evenly until its reset: with R
    requests left, the next waits a share ``reset / (R + 1)``; with R tokens left, a request of
    `tokens` tokens waits ``reset * tokens / (R + tokens)``. So the pace tightens gradually
    as a limit runs low, and nothing left holds until the reset. The longest of them, or 0
    when the headers name no limit with a reset (a reset past two minutes is not believed).
    """
    hold = 0.0
    size = max(tokens, 1)
    for remaining, reset in _HEADER_PAIRS:
        left, when = headers.get(remaining), headers.get(reset)
        if left is None or when is None:
            continue
        try:
            count = float(left.strip())
        except ValueError:
            continue
        if not math.isfinite(count) or count < 0:
            continue
        seconds = _reset_seconds(when, now or datetime.now(UTC))
        if seconds is None or not 0 < seconds <= _HOLD_MOST:
            continue
        cost = 1 if "requests" in remaining else size
        hold = max(hold, seconds * cost / (count + cost))
    return hold


# -- any model, limited ---------------------------------------------------------------------------


class RateLimited:
    """Any model, asked through a `RateLimit`: ``RateLimited(FakeModel([...]), limit)``.

    Each request waits for the limit; its usage corrects the tokens counted; a
    `RateLimitError` holds the whole limit back for `backoff` seconds. Provider models take
    ``rate_limit=`` instead, which also reads their rate-limit headers.

    Args:
        model: The model to ask.
        limit: The limit it is asked through.
        backoff: Seconds a `RateLimitError` holds the limit back.
    """

    __slots__ = ("_backoff", "_counts", "_limit", "_model")

    def __init__(self, model: Model | str, limit: RateLimit, *, backoff: float = 1.0) -> None:
        if not isinstance(limit, RateLimit):
            raise TypeError(f"RateLimited(model, limit) takes a RateLimit, got {limit!r}.")
        if isinstance(backoff, bool) or not isinstance(backoff, int | float) or backoff < 0:
            raise ValueError(f"RateLimited(backoff=...) must be seconds >= 0, got {backoff!r}.")
        self._model = resolve_model(model)
        self._limit = limit
        self._backoff = float(backoff)
        self._counts = limit.counts_tokens  # fixed with the limit: whether tokens are estimated

    @property
    def name(self) -> str:
        """The wrapped model's name."""
        return self._model.name

    @property
    def context_window(self) -> int | None:
        """The wrapped model's context window."""
        return self._model.context_window

    @property
    def options(self) -> dict[str, Any]:
        """The wrapped model's request options (none if it tells none): what a run records."""
        return options_of(self._model)

    @property
    def limit(self) -> RateLimit:
        """The limit requests go through."""
        return self._limit

    def __repr__(self) -> str:
        return f"RateLimited({self._model!r}, {self._limit!r})"

    async def respond(self, request: Request, *, on_text: TextCallback | None = None) -> Reply:
        """Ask the wrapped model once the limit lets the request go."""
        limit = self._limit
        tokens = estimate_tokens(request) if self._counts else 0
        if limit.shared:  # a store's limit: a ticket takes its row and holds its slot
            async with limit.request(tokens):
                return await self._ask(request, on_text, tokens)
        # This process's limit: no ticket, and no await when the request need not wait.
        slot = await _enter_local(limit, tokens)
        try:
            return await self._ask(request, on_text, tokens)
        finally:
            if slot:
                limit._release_local()  # pyright: ignore[reportPrivateUsage]

    async def _ask(self, request: Request, on_text: TextCallback | None, tokens: int) -> Reply:
        """Ask the model once: a 429 holds the limit back, the usage corrects its tokens."""
        limit = self._limit
        try:
            reply = await self._model.respond(request, on_text=on_text)
        except RateLimitError:
            await limit.hold(self._backoff)
            raise
        if tokens:
            spent = reply.usage.input_tokens + reply.usage.output_tokens - tokens
            if not limit.settle_now(spent):  # a store's limit: its row is written
                await limit.settle(spent)
        return reply
