"""`Price`: what a model's tokens cost, so a provider can fill in `Usage.cost`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .._base._reply import Usage

__all__ = ("Price", "request_usage")


def _check(name: str, value: object, *, optional: bool) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"Price.{name} must be a number (per million tokens), got {value!r}.")
    if value < 0 or not math.isfinite(value):
        raise ValueError(f"Price.{name} must be a finite number >= 0, got {value!r}.")


@dataclass(frozen=True, slots=True, kw_only=True)
class Price:
    """Prices per million tokens, in the currency you bill in (usually USD).

    A provider model given a `Price` reports `Usage.cost`; without one the cost stays None, as
    the library keeps no price list of its own. Cached input is priced separately when the
    provider reports it: `cache_read` for tokens read from the prompt cache and `cache_write` for
    tokens written to it; each falls back to `input` when left out.

    Example:
        ```python
        model = OpenAIModel("gpt-4o", price=Price(input=2.5, output=10, cache_read=1.25))
        ```
    """

    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None

    def __post_init__(self) -> None:
        _check("input", self.input, optional=False)
        _check("output", self.output, optional=False)
        _check("cache_read", self.cache_read, optional=True)
        _check("cache_write", self.cache_write, optional=True)

    def cost(
        self,
        *,
        input_tokens: int,
        output_tokens: int,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
    ) -> float:
        """The cost of one request.

        `input_tokens` counts every input token, cached ones included (as `Usage` does); the
        cached part is priced at `cache_read` / `cache_write` and the rest at `input`.
        """
        cached = cache_read_tokens + cache_write_tokens
        fresh = max(input_tokens - cached, 0)
        read = self.input if self.cache_read is None else self.cache_read
        write = self.input if self.cache_write is None else self.cache_write
        total = (
            fresh * self.input
            + cache_read_tokens * read
            + cache_write_tokens * write
            + output_tokens * self.output
        )
        return total / 1_000_000


def request_usage(
    price: Price | None,
    *,
    input_tokens: int,
    output_tokens: int,
    cache_read_tokens: int = 0,
    cache_write_tokens: int = 0,
    reasoning_tokens: int = 0,
) -> Usage:
    """The `Usage` of one request, its cost from `price` (None when there is no price).

    `reasoning_tokens` are counted in `output_tokens` already, and priced with them.
    """
    counts = {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_read_tokens": cache_read_tokens,
        "cache_write_tokens": cache_write_tokens,
    }
    cost = None if price is None else price.cost(**counts)
    return Usage(**counts, requests=1, cost=cost, reasoning_tokens=reasoning_tokens)
